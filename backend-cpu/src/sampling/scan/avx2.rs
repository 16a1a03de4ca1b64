//! The streaming pass of [`super::scan`] for f32 rows on CPUs with AVX2 but not AVX-512: the same
//! block weights and group sample as the generic loop (the tests compare them), written with
//! 256-bit intrinsics. The compiler keeps the generic loop's sixteen lanes of two keys, two
//! positions and f64 sums in memory on AVX2; here they are twelve registers.

use std::arch::x86_64::*;

use super::{BLOCK, GROUP_KEYS, GROUPS, GroupSample};

/// Tokens per step: one group of 16 (two 8-lane halves).
const STEP: usize = 16;

/// `sanitize` on 8 lanes: NaN, zeros and negatives to +0 (the compare is false for NaN), above 1
/// to 1.
#[inline]
#[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
fn sanitize(v: __m256) -> __m256 {
    let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(v, _mm256_setzero_ps());
    _mm256_and_ps(_mm256_min_ps(v, _mm256_set1_ps(1.0)), positive)
}

/// The two largest keys of 8 groups and their positions.
#[derive(Clone, Copy)]
struct TwoLargest {
    max: __m256i,
    second: __m256i,
    pos1: __m256i,
    pos2: __m256i,
}

impl TwoLargest {
    #[inline]
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    fn new() -> Self {
        let zero = _mm256_setzero_si256();
        TwoLargest {
            max: zero,
            second: zero,
            pos1: zero,
            pos2: zero,
        }
    }

    /// `keep_two` on 8 lanes. Keys are sanitized f32 bits (below 2^31), so the signed compare
    /// orders them as the unsigned one does.
    #[inline]
    #[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
    fn keep(&mut self, key: __m256i, q: __m256i) {
        let above_first = _mm256_cmpgt_epi32(key, self.max);
        let above_second = _mm256_cmpgt_epi32(key, self.second);
        self.second = _mm256_blendv_epi8(
            _mm256_blendv_epi8(self.second, key, above_second),
            self.max,
            above_first,
        );
        self.pos2 = _mm256_blendv_epi8(
            _mm256_blendv_epi8(self.pos2, q, above_second),
            self.pos1,
            above_first,
        );
        self.max = _mm256_blendv_epi8(self.max, key, above_first);
        self.pos1 = _mm256_blendv_epi8(self.pos1, q, above_first);
    }
}

/// `floor(p · 2^40)` of 8 sanitized values, exact in f32, widened exactly to two f64 vectors.
#[inline]
#[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
fn weights(p: __m256, scale: __m256) -> (__m256d, __m256d) {
    let w = _mm256_floor_ps(_mm256_mul_ps(p, scale));
    (
        _mm256_cvtps_pd(_mm256_castps256_ps128(w)),
        _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(w)),
    )
}

/// Stores 8 lanes of u32 to `out` (8 entries).
#[inline]
#[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
fn store_u32(out: &mut [u32], v: __m256i) {
    let mut lanes = [0u32; 8];
    // SAFETY: `lanes` holds 8 u32; unaligned stores are allowed.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
    out[..8].copy_from_slice(&lanes);
}

/// Stores 8 lanes of positions (each < 16) to `out` as bytes.
#[inline]
#[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
fn store_pos(out: &mut [u8], v: __m256i) {
    let mut lanes = [0u32; 8];
    store_u32(&mut lanes, v);
    for (o, l) in out.iter_mut().zip(lanes) {
        *o = l as u8;
    }
}

/// [`super::scan`] over the full blocks of an f32 row segment; the caller handles the tail.
///
/// # Safety
/// The CPU must support AVX2; `block_mass` must hold `row.len() / BLOCK` entries and `sample`
/// `row.len() / BLOCK * GROUP_KEYS` keys and positions (when `S`).
#[target_feature(enable = "avx2,popcnt,bmi1,bmi2,lzcnt")]
pub(super) unsafe fn scan_full_blocks<const W: bool, const S: bool>(
    row: &[f32],
    block_mass: &mut [u64],
    sample: GroupSample<'_>,
) -> u64 {
    let scale = _mm256_set1_ps((1u64 << 40) as f32);
    let mut total = 0u64;
    // The row's parts side by side (`streams_for`).
    for b in super::block_order(row.len() / BLOCK, super::streams_for(W, S)) {
        let block = &row[b * BLOCK..(b + 1) * BLOCK];
        let mut acc = [_mm256_setzero_pd(); 4];
        let (mut lo, mut hi) = (TwoLargest::new(), TwoLargest::new());
        for (q, group) in block.chunks_exact(STEP).enumerate() {
            // SAFETY: `group` holds 16 f32; unaligned loads are allowed.
            let (v0, v1) = unsafe {
                (
                    _mm256_loadu_ps(group.as_ptr()),
                    _mm256_loadu_ps(group.as_ptr().add(8)),
                )
            };
            let (p0, p1) = (sanitize(v0), sanitize(v1));
            if S {
                let q = _mm256_set1_epi32(q as i32);
                lo.keep(_mm256_castps_si256(p0), q);
                hi.keep(_mm256_castps_si256(p1), q);
            }
            if W {
                let (w0, w1) = weights(p0, scale);
                let (w2, w3) = weights(p1, scale);
                acc[0] = _mm256_add_pd(acc[0], w0);
                acc[1] = _mm256_add_pd(acc[1], w1);
                acc[2] = _mm256_add_pd(acc[2], w2);
                acc[3] = _mm256_add_pd(acc[3], w3);
            }
        }
        if S {
            let keys = &mut sample.keys[b * GROUP_KEYS..(b + 1) * GROUP_KEYS];
            let pos = &mut sample.pos[b * GROUP_KEYS..(b + 1) * GROUP_KEYS];
            store_u32(&mut keys[..8], lo.max);
            store_u32(&mut keys[8..GROUPS], hi.max);
            store_u32(&mut keys[GROUPS..GROUPS + 8], lo.second);
            store_u32(&mut keys[GROUPS + 8..], hi.second);
            store_pos(&mut pos[..8], lo.pos1);
            store_pos(&mut pos[8..GROUPS], hi.pos1);
            store_pos(&mut pos[GROUPS..GROUPS + 8], lo.pos2);
            store_pos(&mut pos[GROUPS + 8..], hi.pos2);
        }
        if W {
            let sum = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
            let mut lanes = [0f64; 4];
            // SAFETY: `lanes` holds 4 f64.
            unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), sum) };
            // Exact: integers below 2^40, 256 of them.
            let mass = lanes.iter().sum::<f64>() as u64;
            block_mass[b] = mass;
            total += mass;
        }
    }
    total
}
