//! The classify pass of the band path ([`super::classify_blocks`]) for f32 rows, written with
//! AVX-512 and AVX2 intrinsics: the generic loop builds its bitmaps a bit at a time, which the
//! compiler does not vectorize. Both compute the same integers as the generic loop (the tests
//! compare them): per block the exact weight above the band — `floor(p · 2^40)`, exact in f32 (a
//! power-of-two scaling of a sanitized value, then a floor), summed exactly (AVX-512: converted
//! to u64 by a truncation; AVX2: widened to f64, integers below 2^40, 256 of them) — and the
//! exact weight of every token (the row's total, which the one-pass path learns here).
//!
//! Every loop marks the band's tokens, a bit per token (the listing's marks, where their ids are
//! read when needed). The loops for a band around the threshold list its keys as they go (the
//! generic loop lists them from the marks after it): each vector's band keys are packed to the
//! front of a vector (AVX-512 `vpcompressd`, AVX2 a permutation from a table) stored whole at the
//! listing's end, which then grows by their count, so that the listing stays in id order. The
//! loops for a band from a floor to the top (a narrow row's kept set, a few thousand tokens) only
//! mark, and list the keys from the marks a few blocks behind the pass ([`Listed::Behind`]).

use std::arch::x86_64::*;

use super::{BLOCK, Band, Listing, SMALL_KEY};

/// `2^40`, the scale of the weights.
const SCALE: f32 = (1u64 << 40) as f32;
/// How far ahead the pass prefetches, in blocks (16 KiB), into the second-level cache: the
/// one-pass path reads the row from memory here. Farther and into L2 rather than L1 (the
/// scan's 4 KiB into L1): one thread, cold rows, the narrow rows' pass 29–35 → 24–26 µs, the
/// wide rows' 44.6–49.4 → 42.9–46.7 µs (`one_pass::tests::classify_cold_costs`).
const PREFETCH_BLOCKS: usize = 16;

/// The full blocks of an f32 row segment that starts the row (the caller handles the tail), a
/// mass slot per block, and the listing the band's tokens are appended to (emptied, with room
/// for the segment, its marks cleared).
pub(crate) struct Blocks<'a> {
    pub(crate) row: &'a [f32],
    pub(crate) masses: &'a mut [u64],
    pub(crate) listing: &'a mut Listing,
}

/// Where the band's keys are listed: the listing's buffer and how many it holds, and the marks
/// of the block at hand.
struct Out<'a> {
    keys: &'a mut [u32],
    len: usize,
}

impl Out<'_> {
    /// Appends the keys of `block`'s tokens marked in `marks` (its words), in id order: a walk
    /// of the set bits while the block is in the first-level cache.
    #[inline(always)]
    fn push_marked(&mut self, block: &[f32], marks: &[u64]) {
        if marks.iter().fold(0, |any, &word| any | word) == 0 {
            return;
        }
        for (w, &word) in marks.iter().enumerate() {
            for bit in super::set_bits(word) {
                self.keys[self.len] = super::key_of(block[w * 64 + bit]);
                self.len += 1;
            }
        }
    }
}

/// How the band's keys are listed by [`blocks_with`]'s loop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listed {
    /// By the block step itself, as it goes (a compress per vector).
    InStep,
    /// From the marks the block step stored, [`LIST_BEHIND`] blocks later (a walk of their bits).
    Behind,
}

/// How many blocks behind the pass the marks are walked for [`Listed::Behind`]: far enough that
/// the marks' values, and so the walk's branches, are known by then (the walk right after the
/// block waits, at each mispredicted branch, for the block's loads from memory and loses the
/// loads issued past it: 42 µs a cold kept~1k row instead of 29), near enough that the block is
/// still in the first-level cache.
const LIST_BEHIND: usize = 4;

/// The loop over the full blocks of both vector widths: `block_step` classifies one block, marks
/// its band tokens in the block's words (and lists their keys, [`Listed::InStep`]) and returns
/// its exact weight above the band (stored in its slot of `masses`) and its exact weight. Returns
/// both summed over the blocks.
#[inline(always)]
fn blocks_with(
    blocks: Blocks<'_>,
    listed: Listed,
    mut block_step: impl FnMut(&[f32], &mut Out<'_>, &mut [u64]) -> (u64, u64),
) -> (u64, u64) {
    let Blocks {
        row,
        masses,
        listing,
    } = blocks;
    let Listing { keys, len, marks } = listing;
    let mut out = Out { keys, len: *len };
    let (mut total, mut every) = (0u64, 0u64);
    let words = super::MARK_WORDS;
    let behind = if listed == Listed::Behind {
        LIST_BEHIND
    } else {
        0
    };
    let count = row.len() / BLOCK;
    for (b, (block, mass)) in row.chunks_exact(BLOCK).zip(masses).enumerate() {
        // Ask for the block PREFETCH_BLOCKS ahead (a hint: never faults, even past the end).
        let ahead = block
            .as_ptr()
            .wrapping_add(PREFETCH_BLOCKS * BLOCK)
            .cast::<i8>();
        for line in 0..BLOCK * 4 / 64 {
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(line * 64)) };
        }
        let (above, all) = block_step(block, &mut out, &mut marks[b * words..(b + 1) * words]);
        *mass = above;
        total += above;
        every += all;
        if behind > 0 && b >= behind {
            let earlier = b - behind;
            let marked = &marks[earlier * words..(earlier + 1) * words];
            out.push_marked(&row[earlier * BLOCK..(earlier + 1) * BLOCK], marked);
        }
    }
    // The last blocks' marks (none for `Listed::InStep`).
    for earlier in count.saturating_sub(behind)..count {
        let marked = &marks[earlier * words..(earlier + 1) * words];
        out.push_marked(&row[earlier * BLOCK..(earlier + 1) * BLOCK], marked);
    }
    *len = out.len;
    (total, every)
}

/// AVX-512: sixteen tokens per vector, a compare mask per vector selects the band's lanes.
pub(super) mod avx512 {
    use super::*;

    /// `sanitize` on 16 lanes: NaN, zeros and negatives to +0 (the compare is false for NaN),
    /// above 1 to 1.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    fn sanitize(v: __m512) -> __m512 {
        let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, _mm512_setzero_ps());
        _mm512_maskz_min_ps(positive, v, _mm512_set1_ps(1.0))
    }

    /// The weights `floor(p · 2^40)` of 16 sanitized values as two vectors of u64: the product is
    /// exact in f32 (a power-of-two scaling) and the conversion truncates, which is the floor of a
    /// non-negative value. Summed in integer lanes (the vector unit's integer adders are more
    /// than its floating-point ones).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn weights(p: __m512, scale: __m512) -> (__m512i, __m512i) {
        let w = _mm512_mul_ps(p, scale);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(w)));
        (
            _mm512_cvttps_epu64(_mm512_castps512_ps256(w)),
            _mm512_cvttps_epu64(hi),
        )
    }

    /// Appends the lanes of `keys` that `mask` selects to `out`, in lane order.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    fn list(out: &mut Out<'_>, mask: __mmask16, keys: __m512i) {
        let at = out.len;
        // Whole vectors are stored (the lanes past the selected ones are overwritten later): the
        // listing holds at most one token per token before this vector's, so these 16 slots lie
        // inside the buffer, which holds the whole segment.
        let keys_at = &mut out.keys[at..at + 16];
        // SAFETY: the slice holds 16 u32; unaligned stores are allowed.
        unsafe {
            _mm512_storeu_si512(
                keys_at.as_mut_ptr().cast(),
                _mm512_maskz_compress_epi32(mask, keys),
            );
        }
        out.len = at + mask.count_ones() as usize;
    }

    /// The classify pass over the full blocks of an f32 row segment; returns the exact weight
    /// above the band and the exact weight of the segment.
    ///
    /// `LIGHT`, for a row with few values of [`SMALL_KEY`] or more (a very flat row, by its
    /// sample): a vector of small values only — its raw bits are its keys — sums its weights in
    /// 32-bit lanes, one conversion of sixteen, any other vector the 64-bit sums. The branch
    /// between them is a mispredicted one per heavy vector, which the sample keeps rare: 27
    /// against 36 µs a warm row of kept~100k. Without `LIGHT` every vector takes the 64-bit
    /// sums, no branch.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and AVX-512DQ.
    #[target_feature(enable = "avx512f,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    pub(crate) unsafe fn classify_full_blocks<const LIGHT: bool>(
        blocks: Blocks<'_>,
        band: Band,
    ) -> (u64, u64) {
        let (low, high) = (
            _mm512_set1_epi32(band.low as i32),
            _mm512_set1_epi32(band.high as i32),
        );
        let scale = _mm512_set1_ps(SCALE);
        let small = _mm512_set1_epi32(SMALL_KEY as i32);
        blocks_with(blocks, Listed::InStep, |block, out, marks| {
            let (mut acc0, mut acc1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            let (mut all0, mut all1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            // 32-bit lanes: sixteen weights below 2^27 each.
            let (mut acc_small, mut all_small) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            // A vector's 16 tokens are 16 consecutive bits of the marks (x86 is little-endian).
            let vector_marks: &mut [u16] = bytemuck::cast_slice_mut(marks);
            for (lanes, mark) in block.chunks_exact(16).zip(vector_marks) {
                // SAFETY: `lanes` holds 16 f32; unaligned loads are allowed.
                let raw = unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) };
                let light = LIGHT && _mm512_cmplt_epu32_mask(raw, small) == u16::MAX;
                let p = if light {
                    _mm512_castsi512_ps(raw)
                } else {
                    sanitize(_mm512_castsi512_ps(raw))
                };
                let key = _mm512_castps_si512(p);
                let above = _mm512_cmpge_epu32_mask(key, high);
                let in_band = _mm512_mask_cmpge_epu32_mask(!above, key, low);
                list(out, in_band, key);
                *mark = in_band;
                if light {
                    // Exact: a weight below 2^27 converts exactly (a truncation, the floor).
                    let w = _mm512_cvttps_epi32(_mm512_mul_ps(p, scale));
                    all_small = _mm512_add_epi32(all_small, w);
                    acc_small = _mm512_mask_add_epi32(acc_small, above, acc_small, w);
                } else {
                    let (lo, hi) = weights(p, scale);
                    all0 = _mm512_add_epi64(all0, lo);
                    all1 = _mm512_add_epi64(all1, hi);
                    acc0 = _mm512_mask_add_epi64(acc0, above as u8, acc0, lo);
                    acc1 = _mm512_mask_add_epi64(acc1, (above >> 8) as u8, acc1, hi);
                }
            }
            (
                sum_lanes([acc0, acc1], acc_small),
                sum_lanes([all0, all1], all_small),
            )
        })
    }

    /// The sum of two vectors of u64 lanes and one of u32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn sum_lanes([lo, hi]: [__m512i; 2], small: __m512i) -> u64 {
        let widened = _mm512_add_epi64(
            _mm512_cvtepu32_epi64(_mm512_castsi512_si256(small)),
            _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(small)),
        );
        _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(lo, hi), widened)) as u64
    }

    /// The classify pass of a band from a floor to the top (`Band::from_floor`: nothing above
    /// it, a few thousand tokens at most, the kept set of a narrow row) over the full blocks of
    /// an f32 row segment: each vector's compare mask is stored as its 16 bits of the marks, and
    /// the marked tokens' keys are listed a few blocks behind ([`Listed::Behind`]). No weight
    /// above the band to sum, no compress. Returns `(0, exact weight of the segment)`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and AVX-512DQ.
    #[target_feature(enable = "avx512f,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    pub(crate) unsafe fn classify_sparse_full_blocks(blocks: Blocks<'_>, band: Band) -> (u64, u64) {
        let low = _mm512_set1_epi32(band.low as i32);
        let scale = _mm512_set1_ps(SCALE);
        blocks_with(blocks, Listed::Behind, |block, _, marks| {
            let (mut all0, mut all1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            let vector_marks: &mut [u16] = bytemuck::cast_slice_mut(marks);
            for (lanes, mark) in block.chunks_exact(16).zip(vector_marks) {
                // SAFETY: `lanes` holds 16 f32; unaligned loads are allowed.
                let p = sanitize(unsafe { _mm512_loadu_ps(lanes.as_ptr()) });
                *mark = _mm512_cmpge_epu32_mask(_mm512_castps_si512(p), low);
                let (lo, hi) = weights(p, scale);
                all0 = _mm512_add_epi64(all0, lo);
                all1 = _mm512_add_epi64(all1, hi);
            }
            (
                0,
                _mm512_reduce_add_epi64(_mm512_add_epi64(all0, all1)) as u64,
            )
        })
    }
}

/// AVX2: eight tokens per vector, a sign mask per vector selects the band's lanes.
pub(super) mod avx2 {
    use super::*;
    use crate::sampling::pack::PACK8;

    /// `sanitize` on 8 lanes: NaN, zeros and negatives to +0 (the compare is false for NaN),
    /// above 1 to 1.
    #[inline]
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    fn sanitize(v: __m256) -> __m256 {
        let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(v, _mm256_setzero_ps());
        _mm256_and_ps(_mm256_min_ps(v, _mm256_set1_ps(1.0)), positive)
    }

    /// The weights `floor(p · 2^40)` of 8 sanitized values (`p ≤ 1`) as two vectors of 32-bit
    /// integers, `(hi, lo)` with weight `= hi · 2^16 + lo`: `x = p · 2^24` is exact (a
    /// power-of-two scaling) and below `2^31`, its truncation `hi` is its floor, `x − hi` is
    /// exact (a value less its integer part), and `lo` the floor of that fraction times `2^16`.
    /// Summed in integer lanes (`hi ≤ 2^24`, `lo < 2^16`: 32 of each, a block's share per lane,
    /// fit in 32 bits), instead of widened to f64 four lanes at a time.
    #[inline]
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    fn split_weights(p: __m256) -> (__m256i, __m256i) {
        let x = _mm256_mul_ps(p, _mm256_set1_ps((1u32 << 24) as f32));
        let hi = _mm256_cvttps_epi32(x);
        let fraction = _mm256_sub_ps(x, _mm256_cvtepi32_ps(hi));
        let lo = _mm256_cvttps_epi32(_mm256_mul_ps(fraction, _mm256_set1_ps(65536.0)));
        (hi, lo)
    }

    /// The eight 32-bit lanes of `hi` and of `lo` summed, as `Σhi · 2^16 + Σlo`.
    #[inline]
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    fn join_sums(hi: __m256i, lo: __m256i) -> u64 {
        let (mut his, mut los) = ([0u32; 8], [0u32; 8]);
        // SAFETY: each array holds 8 u32; unaligned stores are allowed.
        unsafe {
            _mm256_storeu_si256(his.as_mut_ptr().cast(), hi);
            _mm256_storeu_si256(los.as_mut_ptr().cast(), lo);
        }
        let sum = |lanes: [u32; 8]| lanes.iter().map(|&v| u64::from(v)).sum::<u64>();
        (sum(his) << 16) + sum(los)
    }

    /// Appends the lanes of `keys` that `mask` selects to `out`, in lane order.
    #[inline]
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    fn list(out: &mut Out<'_>, mask: u8, keys: __m256i) {
        let at = out.len;
        let order = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(PACK8[usize::from(mask)] as i64));
        // Whole vectors are stored, as in the AVX-512 loop (the same bound).
        let keys_at = &mut out.keys[at..at + 8];
        // SAFETY: the slice holds 8 u32; unaligned stores are allowed.
        unsafe {
            _mm256_storeu_si256(
                keys_at.as_mut_ptr().cast(),
                _mm256_permutevar8x32_epi32(keys, order),
            );
        }
        out.len = at + mask.count_ones() as usize;
    }

    /// As the AVX-512 loop: with `LIGHT`, a vector of eight small values sums its weights in
    /// 32-bit lanes (32 a lane in a block, each below `2^27`: below `2^32`, exact read as u32),
    /// one conversion; any other vector the split weights.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(crate) unsafe fn classify_full_blocks<const LIGHT: bool>(
        blocks: Blocks<'_>,
        band: Band,
    ) -> (u64, u64) {
        // Keys of sanitized values are at most the key of 1.0 (below 2^31), so the signed compare
        // orders them as the unsigned one does once the bounds are capped below 2^31 too (a bound
        // above every key stays above every key).
        let cap = |bound: u32| bound.min(i32::MAX as u32) as i32;
        let (low, high) = (
            _mm256_set1_epi32(cap(band.low)),
            _mm256_set1_epi32(cap(band.high)),
        );
        let small = _mm256_set1_epi32(SMALL_KEY as i32);
        blocks_with(blocks, Listed::InStep, |block, out, marks| {
            let (mut acc_hi, mut acc_lo) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let (mut all_hi, mut all_lo) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let (mut acc_small, mut all_small) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            // A vector's 8 tokens are a byte of the marks (x86 is little-endian).
            let vector_marks: &mut [u8] = bytemuck::cast_slice_mut(marks);
            for (lanes, mark) in block.chunks_exact(8).zip(vector_marks) {
                // SAFETY: `lanes` holds 8 f32; unaligned loads are allowed.
                let raw = unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) };
                // Small: below SMALL_KEY as a signed integer, and no sign bit.
                let below = _mm256_andnot_si256(raw, _mm256_cmpgt_epi32(small, raw));
                let light = LIGHT && _mm256_movemask_ps(_mm256_castsi256_ps(below)) == 0xff;
                let p = if light {
                    _mm256_castsi256_ps(raw)
                } else {
                    sanitize(_mm256_castsi256_ps(raw))
                };
                let key = _mm256_castps_si256(p);
                // key < bound, lane by lane (all ones where it holds).
                let below_high = _mm256_cmpgt_epi32(high, key);
                let below_low = _mm256_cmpgt_epi32(low, key);
                let in_band = _mm256_andnot_si256(below_low, below_high);
                let lane_bits = _mm256_movemask_ps(_mm256_castsi256_ps(in_band)) as u8;
                list(out, lane_bits, key);
                *mark = lane_bits;
                if light {
                    let w = _mm256_cvttps_epi32(_mm256_mul_ps(p, _mm256_set1_ps(SCALE)));
                    all_small = _mm256_add_epi32(all_small, w);
                    acc_small = _mm256_add_epi32(acc_small, _mm256_andnot_si256(below_high, w));
                } else {
                    let (hi, lo) = split_weights(p);
                    all_hi = _mm256_add_epi32(all_hi, hi);
                    all_lo = _mm256_add_epi32(all_lo, lo);
                    acc_hi = _mm256_add_epi32(acc_hi, _mm256_andnot_si256(below_high, hi));
                    acc_lo = _mm256_add_epi32(acc_lo, _mm256_andnot_si256(below_high, lo));
                }
            }
            (
                join_sums(acc_hi, acc_lo) + sum_u32(acc_small),
                join_sums(all_hi, all_lo) + sum_u32(all_small),
            )
        })
    }

    /// The eight u32 lanes of `v` summed.
    #[inline]
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    fn sum_u32(v: __m256i) -> u64 {
        let mut lanes = [0u32; 8];
        // SAFETY: the array holds 8 u32; unaligned stores are allowed.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
        lanes.iter().map(|&l| u64::from(l)).sum()
    }

    /// As the AVX-512 loop, a byte of marks per vector of 8.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    pub(crate) unsafe fn classify_sparse_full_blocks(blocks: Blocks<'_>, band: Band) -> (u64, u64) {
        // Sanitized keys are below 2^31: the signed compare orders them as the unsigned one
        // does once the bound is capped below 2^31 too.
        let low = _mm256_set1_epi32(band.low.min(i32::MAX as u32) as i32);
        blocks_with(blocks, Listed::Behind, |block, _, marks| {
            let (mut all_hi, mut all_lo) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let vector_marks: &mut [u8] = bytemuck::cast_slice_mut(marks);
            for (lanes, mark) in block.chunks_exact(8).zip(vector_marks) {
                // SAFETY: `lanes` holds 8 f32; unaligned loads are allowed.
                let p = sanitize(unsafe { _mm256_loadu_ps(lanes.as_ptr()) });
                let below_low = _mm256_cmpgt_epi32(low, _mm256_castps_si256(p));
                *mark = !(_mm256_movemask_ps(_mm256_castsi256_ps(below_low)) as u8);
                let (hi, lo) = split_weights(p);
                all_hi = _mm256_add_epi32(all_hi, hi);
                all_lo = _mm256_add_epi32(all_lo, lo);
            }
            (0, join_sums(all_hi, all_lo))
        })
    }
}
