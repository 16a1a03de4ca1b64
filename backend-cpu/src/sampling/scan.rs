//! The streaming loops of the CPU backend's fast paths, written so that the compiler vectorizes
//! them, and compiled three times: for AVX-512, for AVX2 and for the baseline target. The variant is
//! chosen at run time; all three compute the same integers (the tests compare them).
//!
//! - [`scan`]: one pass over a row that yields its exact total weight, the exact weight of every
//!   [`BLOCK`] of tokens and the two largest rank keys of every *group*: the 16 tokens of a block
//!   that share a vector lane (ids `b·256 + 16q + l`, q = 0 … 15, for lane l), so that they fall out
//!   of the vector loop without any horizontal reduction;
//! - [`collect`]: the tokens whose key reaches a floor, from the sub-blocks that can hold one;
//! - [`argmax_row`]: the first token with the largest value in argmax order.

use specula_backend_api::{DType, FloatElement};

/// Tokens per block of exact weight.
pub(crate) const BLOCK: usize = 256;
/// A token at or above a floor: its rank key and id. `repr(C)`, key first, so that the AVX-512
/// loop can write one as a 64-bit lane (key in the low half).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Rank key.
    pub key: u32,
    /// Token id.
    pub id: u32,
}

/// The rank key of 1.0, the largest one.
pub(crate) const ONE_KEY: u32 = 0x3f80_0000;
/// Groups per block: one per vector lane.
pub(crate) const GROUPS: usize = 16;
/// Keys [`scan`] keeps per block: the largest key of each group, then the second largest.
pub(crate) const GROUP_KEYS: usize = 2 * GROUPS;
/// Vector lanes the loops are written for (16 × f32 = one AVX-512 register).
const LANES: usize = 16;

/// `sanitize(p)` as a branch-free select (the same value as `fixed_point::sanitize`): NaN, zeros
/// and negatives to +0, above 1 to 1.
#[inline(always)]
fn sanitized<T: FloatElement>(v: T) -> f32 {
    let p = v.to_f32();
    if p > 0.0 { p.min(1.0) } else { 0.0 }
}

/// The rank key of a value.
#[inline(always)]
pub(crate) fn key_of<T: FloatElement>(v: T) -> u32 {
    sanitized(v).to_bits()
}

/// The weight of a rank key, branch-free. Keys of sanitized values are at most
/// `1.0f32.to_bits()`, so the exponent is at most 127.
#[inline(always)]
pub(crate) fn weight_of_key(key: u32) -> u64 {
    let exp = key >> 23;
    let mantissa = u64::from((key & 0x7f_ffff) | 0x80_0000);
    let shift = 127 - exp;
    // value = mantissa · 2^(exp − 150); weight = floor(value · 2^40) = (mantissa << 17) >> (127 − exp).
    if shift < 64 {
        (mantissa << 17) >> shift
    } else {
        0
    }
}

/// Where [`scan`] writes what it keeps of a row's groups: per block, [`GROUP_KEYS`] keys (the
/// largest key of each group, then the second largest) and as many positions (the vector index
/// `q` of the token holding each of them).
pub(crate) struct GroupSample<'a> {
    /// The two largest keys of each group.
    pub keys: &'a mut [u32],
    /// The position (`q`, 0 … 15) of each of those keys within its group.
    pub pos: &'a mut [u8],
}

impl GroupSample<'_> {
    /// The part of the sample from block `b` on.
    fn at_block(&mut self, b: usize) -> GroupSample<'_> {
        GroupSample {
            keys: &mut self.keys[b * GROUP_KEYS..],
            pos: &mut self.pos[b * GROUP_KEYS..],
        }
    }
}

/// Folds token `key` at position `q` into a group's two largest keys and their positions. Ties
/// keep the earlier token as the largest, so the two are always distinct tokens.
#[inline(always)]
fn keep_two(key: u32, q: u32, max: &mut u32, second: &mut u32, pos1: &mut u32, pos2: &mut u32) {
    let above_first = key > *max;
    let above_second = key > *second;
    *second = if above_first {
        *max
    } else if above_second {
        key
    } else {
        *second
    };
    *pos2 = if above_first {
        *pos1
    } else if above_second {
        q
    } else {
        *pos2
    };
    if above_first {
        *max = key;
        *pos1 = q;
    }
}

/// One full block: exact weight (returned) and the two largest keys of each group.
///
/// The weight of a token is `floor(p · 2^40)`, computed in f32 (exact: a power-of-two scaling of a
/// sanitized value, then a floor) and summed in f64 (exact: integers below 2^40, 256 of them).
#[inline(always)]
fn scan_block<T: FloatElement, const W: bool, const S: bool>(
    block: &[T],
    sample: GroupSample<'_>,
) -> u64 {
    const SCALE: f32 = (1u64 << 40) as f32;
    let mut mass = [0f64; LANES];
    let (mut max, mut second) = ([0u32; LANES], [0u32; LANES]);
    let (mut pos1, mut pos2) = ([0u32; LANES], [0u32; LANES]);
    for (q, chunk) in block.chunks_exact(LANES).enumerate() {
        for lane in 0..LANES {
            let p = sanitized(chunk[lane]);
            if S {
                let (m, s) = (&mut max[lane], &mut second[lane]);
                keep_two(
                    p.to_bits(),
                    q as u32,
                    m,
                    s,
                    &mut pos1[lane],
                    &mut pos2[lane],
                );
            }
            if W {
                mass[lane] += f64::from((p * SCALE).floor());
            }
        }
    }
    if S {
        sample.keys[..GROUPS].copy_from_slice(&max);
        sample.keys[GROUPS..GROUP_KEYS].copy_from_slice(&second);
        for lane in 0..LANES {
            sample.pos[lane] = pos1[lane] as u8;
            sample.pos[GROUPS + lane] = pos2[lane] as u8;
        }
    }
    mass.iter().sum::<f64>() as u64
}

/// A segment of a row that starts on a block boundary: see [`scan`].
#[inline(always)]
fn scan_generic<T: FloatElement, const W: bool, const S: bool>(
    row: &[T],
    block_mass: &mut [u64],
    mut sample: GroupSample<'_>,
) -> u64 {
    let mut total = 0u64;
    let full = row.len() / BLOCK;
    for (b, block) in row.chunks_exact(BLOCK).enumerate() {
        let mass = scan_block::<T, W, S>(block, sample.at_block(b));
        block_mass[b] = mass;
        total += mass;
    }
    // The partial block at the end, token by token.
    let tail = &row[full * BLOCK..];
    if !tail.is_empty() {
        let mut mass = 0u64;
        let (mut max, mut second) = ([0u32; LANES], [0u32; LANES]);
        let (mut pos1, mut pos2) = ([0u32; LANES], [0u32; LANES]);
        for (i, &v) in tail.iter().enumerate() {
            let key = key_of(v);
            let (lane, q) = (i % GROUPS, (i / GROUPS) as u32);
            let (m, s) = (&mut max[lane], &mut second[lane]);
            keep_two(key, q, m, s, &mut pos1[lane], &mut pos2[lane]);
            mass += weight_of_key(key);
        }
        let out = sample.at_block(full);
        out.keys[..GROUPS].copy_from_slice(&max);
        out.keys[GROUPS..GROUP_KEYS].copy_from_slice(&second);
        for lane in 0..LANES {
            out.pos[lane] = pos1[lane] as u8;
            out.pos[GROUPS + lane] = pos2[lane] as u8;
        }
        block_mass[full] = mass;
        total += mass;
    }
    total
}

/// Whether this CPU runs the AVX-512 variants (and the hand-written loops of `avx512`).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512() -> bool {
    /// `SPECULA_CPU_MAX_ISA=avx2` keeps an AVX-512 CPU on the AVX2 loops (to test or measure them
    /// there); read once.
    static CAPPED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let capped = *CAPPED.get_or_init(|| {
        std::env::var("SPECULA_CPU_MAX_ISA").is_ok_and(|isa| isa.eq_ignore_ascii_case("avx2"))
    });
    !capped && cpu_has_avx512()
}

/// Whether this CPU runs the AVX-512 variants ([`has_avx512`]) and has AVX-512 VBMI2 (the
/// 16-bit `vpcompressw`), read once.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512_vbmi2() -> bool {
    static VBMI2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    has_avx512() && *VBMI2.get_or_init(|| std::arch::is_x86_feature_detected!("avx512vbmi2"))
}

/// Whether this CPU has every feature the AVX-512 variants are compiled with, whatever
/// `SPECULA_CPU_MAX_ISA` says (the tests run every variant the CPU has).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn cpu_has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && has_avx2()
}

/// Whether this CPU has the scalar bit instructions every vector variant is compiled with
/// (`popcnt`, BMI1, BMI2, `lzcnt`): without them the compiler spells `count_ones` in a dozen
/// shifts and masks. Every CPU with AVX2 has them; the check keeps the dispatch sound on any
/// that would not.
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_bit_ops() -> bool {
    std::arch::is_x86_feature_detected!("popcnt")
        && std::arch::is_x86_feature_detected!("bmi1")
        && std::arch::is_x86_feature_detected!("bmi2")
        && std::arch::is_x86_feature_detected!("lzcnt")
}

/// Whether this CPU runs the AVX2 variants: it has every feature they are compiled with.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
        && has_bit_ops()
}

/// Defines `$name`: the generic loop `$generic` compiled for AVX-512 or AVX2 (x86_64 only), to be
/// called where [`has_avx512`] or [`has_avx2`] holds.
macro_rules! compiled_for {
    (avx512, $($rest:tt)*) => {
        $crate::sampling::scan::compiled_for!(@ "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,popcnt,bmi1,bmi2,lzcnt", $($rest)*);
    };
    (avx2, $($rest:tt)*) => {
        $crate::sampling::scan::compiled_for!(@ "avx2,fma,f16c,popcnt,bmi1,bmi2,lzcnt", $($rest)*);
    };
    (@ $features:literal, fn $name:ident [$($gp:tt)*] ($($arg:ident: $ty:ty),*) -> $ret:ty
        = $generic:ident [$($ga:tt)*]) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        fn $name<$($gp)*>($($arg: $ty),*) -> $ret {
            $generic::<$($ga)*>($($arg),*)
        }
    };
}

/// Runs the best compiled variant of a generic loop for this CPU.
macro_rules! dispatch {
    // The three functions' paths as token trees: with their generic arguments, or without (an
    // empty `::<>`, which the arm below cannot tell from the end of a list).
    (@call [$($generic:tt)*] [$($avx512:tt)*] [$($avx2:tt)*] ($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        let result = if has_avx512() {
            // SAFETY: the CPU supports the features the variant is compiled for.
            unsafe { $($avx512)*($($arg),*) }
        } else if has_avx2() {
            // SAFETY: as above.
            unsafe { $($avx2)*($($arg),*) }
        } else {
            $($generic)*($($arg),*)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let result = $($generic)*($($arg),*);
        result
    }};
    ($generic:ident::<>($($arg:expr),*) via $avx512:ident, $avx2:ident) => {
        $crate::sampling::scan::dispatch!(@call [$generic] [$avx512] [$avx2] ($($arg),*))
    };
    ($generic:ident::<$($g:tt),*>($($arg:expr),*) via $avx512:ident, $avx2:ident) => {
        $crate::sampling::scan::dispatch!(@call [$generic::<$($g),*>] [$avx512::<$($g),*>]
            [$avx2::<$($g),*>] ($($arg),*))
    };
}

/// Defines `$name`, which runs [`dispatch`]'s choice of the generic loop `$generic`: its
/// AVX-512 and AVX2 compilations ([`compiled_for`], items inside `$name`) or `$generic` itself.
/// The signature is written once, for the three.
macro_rules! dispatched {
    ($(#[$attr:meta])* $vis:vis fn $name:ident [$($gp:tt)*] ($($arg:ident: $ty:ty),*) -> $ret:ty
        = $generic:ident [$($ga:tt)*]) => {
        $(#[$attr])*
        $vis fn $name<$($gp)*>($($arg: $ty),*) -> $ret {
            $crate::sampling::scan::compiled_for!(avx512, fn avx512 [$($gp)*]
                ($($arg: $ty),*) -> $ret = $generic [$($ga)*]);
            $crate::sampling::scan::compiled_for!(avx2, fn avx2 [$($gp)*]
                ($($arg: $ty),*) -> $ret = $generic [$($ga)*]);
            $crate::sampling::scan::dispatch!($generic::<$($ga)*>($($arg),*) via avx512, avx2)
        }
    };
}

pub(crate) use {compiled_for, dispatch, dispatched};

compiled_for!(avx512, fn scan_avx512 [T: FloatElement, const W: bool, const S: bool]
    (row: &[T], block_mass: &mut [u64], sample: GroupSample<'_>) -> u64
    = scan_generic [T, W, S]);
compiled_for!(avx2, fn scan_avx2 [T: FloatElement, const W: bool, const S: bool]
    (row: &[T], block_mass: &mut [u64], sample: GroupSample<'_>) -> u64
    = scan_generic [T, W, S]);

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Hand-written AVX-512 loops for f32 rows, the common case (the compiler keeps the generic loops
/// in 256-bit registers and spills their accumulators).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{BLOCK, Candidate, Collect, GROUP_KEYS, GROUPS, GroupSample, ROUND};
    use specula_backend_api::FloatElement;
    use std::arch::x86_64::*;

    /// How far ahead the scan prefetches when it reads the row in order, in blocks (4 KiB); one
    /// block in each part when it reads parts side by side.
    const PREFETCH_BLOCKS: usize = 4;

    /// `sanitize` on 16 lanes: NaN, zeros and negatives to +0 (the compare is false for NaN),
    /// above 1 to 1.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    fn sanitize(v: __m512) -> __m512 {
        let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, _mm512_setzero_ps());
        _mm512_maskz_min_ps(positive, v, _mm512_set1_ps(1.0))
    }

    /// `floor(p · 2^40)` of 16 sanitized values, exact in f32, widened exactly to two f64 vectors.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    fn weights(p: __m512, scale: __m512) -> (__m512d, __m512d) {
        let w = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(p, scale),
        );
        let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(w));
        let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(w),
        )));
        (lo, hi)
    }

    /// [`super::scan`] over the full blocks of an f32 row segment; the caller handles the tail.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `block_mass` must hold `row.len() / BLOCK` entries and
    /// `sample` `row.len() / BLOCK * GROUP_KEYS` keys and positions.
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn scan_full_blocks<const W: bool, const S: bool>(
        row: &[f32],
        block_mass: &mut [u64],
        sample: GroupSample<'_>,
    ) -> u64 {
        let scale = _mm512_set1_ps((1u64 << 40) as f32);
        let mut total = 0u64;
        // The row's parts side by side (`streams_for`); the prefetch distance within a part.
        let streams = super::streams_for(W, S);
        let distance = if streams > 1 { 1 } else { PREFETCH_BLOCKS };
        for b in super::block_order(row.len() / BLOCK, streams) {
            let block = &row[b * BLOCK..(b + 1) * BLOCK];
            // Ask for the block `distance` ahead in this part (a hint: never faults, even past
            // the end).
            let ahead = block.as_ptr().wrapping_add(distance * BLOCK).cast::<i8>();
            for line in 0..BLOCK * 4 / 64 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
            }
            let (mut acc0, mut acc1, mut acc2, mut acc3) = (
                _mm512_setzero_pd(),
                _mm512_setzero_pd(),
                _mm512_setzero_pd(),
                _mm512_setzero_pd(),
            );
            let mut max = _mm512_setzero_si512();
            let mut second = _mm512_setzero_si512();
            let mut pos1 = _mm512_setzero_si512();
            let mut pos2 = _mm512_setzero_si512();
            for (i, pair) in block.chunks_exact(32).enumerate() {
                // SAFETY: `pair` holds 32 f32; unaligned loads are allowed.
                let (v0, v1) = unsafe {
                    (
                        _mm512_loadu_ps(pair.as_ptr()),
                        _mm512_loadu_ps(pair.as_ptr().add(16)),
                    )
                };
                let (p0, p1) = (sanitize(v0), sanitize(v1));
                for (j, key) in [_mm512_castps_si512(p0), _mm512_castps_si512(p1)]
                    .into_iter()
                    .enumerate()
                    .filter(|_| S)
                {
                    // `keep_two` on 16 lanes.
                    let q = _mm512_set1_epi32((2 * i + j) as i32);
                    let above_first = _mm512_cmpgt_epu32_mask(key, max);
                    let above_second = _mm512_cmpgt_epu32_mask(key, second);
                    second = _mm512_mask_mov_epi32(
                        _mm512_mask_mov_epi32(second, above_second, key),
                        above_first,
                        max,
                    );
                    pos2 = _mm512_mask_mov_epi32(
                        _mm512_mask_mov_epi32(pos2, above_second, q),
                        above_first,
                        pos1,
                    );
                    max = _mm512_mask_mov_epi32(max, above_first, key);
                    pos1 = _mm512_mask_mov_epi32(pos1, above_first, q);
                }
                if W {
                    let (lo0, hi0) = weights(p0, scale);
                    let (lo1, hi1) = weights(p1, scale);
                    acc0 = _mm512_add_pd(acc0, lo0);
                    acc1 = _mm512_add_pd(acc1, hi0);
                    acc2 = _mm512_add_pd(acc2, lo1);
                    acc3 = _mm512_add_pd(acc3, hi1);
                }
            }
            let keys = &mut sample.keys[b * GROUP_KEYS..(b + 1) * GROUP_KEYS];
            let pos = &mut sample.pos[b * GROUP_KEYS..(b + 1) * GROUP_KEYS];
            if S {
                // SAFETY: `keys` holds 32 u32 and `pos` 32 u8.
                unsafe {
                    _mm512_storeu_si512(keys.as_mut_ptr().cast(), max);
                    _mm512_storeu_si512(keys.as_mut_ptr().add(GROUPS).cast(), second);
                    _mm_storeu_si128(pos.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(pos1));
                    _mm_storeu_si128(
                        pos.as_mut_ptr().add(GROUPS).cast(),
                        _mm512_cvtepi32_epi8(pos2),
                    );
                }
            }
            if !W {
                continue;
            }
            let sum = _mm512_add_pd(_mm512_add_pd(acc0, acc1), _mm512_add_pd(acc2, acc3));
            // Exact: integers below 2^40, 256 of them.
            let mass = _mm512_reduce_add_pd(sum) as u64;
            block_mass[b] = mass;
            total += mass;
        }
        total
    }

    /// Appends the lanes `mask` of `(keys, ids)` to `out` as candidates, with one compress per
    /// half vector.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    unsafe fn push_pairs(keys: __m512i, ids: __m512i, mask: u16, out: &mut Vec<Candidate>) {
        out.reserve(2 * 8);
        let len = out.len();
        let dst = out.as_mut_ptr().wrapping_add(len).cast::<u64>();
        let mut written = 0usize;
        for half in 0..2 {
            let (k, i) = if half == 0 {
                (_mm512_castsi512_si256(keys), _mm512_castsi512_si256(ids))
            } else {
                (
                    _mm512_extracti64x4_epi64::<1>(keys),
                    _mm512_extracti64x4_epi64::<1>(ids),
                )
            };
            let m = (mask >> (8 * half)) as u8;
            // (key, id) as one 64-bit lane: key low, id high (`Candidate` is repr(C)).
            let pairs = _mm512_or_si512(
                _mm512_cvtepu32_epi64(k),
                _mm512_slli_epi64::<32>(_mm512_cvtepu32_epi64(i)),
            );
            let packed = _mm512_maskz_compress_epi64(m, pairs);
            // SAFETY: `written` ≤ 8 and the capacity holds 16 entries past `len`; lanes past the
            // packed ones are overwritten or left beyond the length.
            unsafe { _mm512_storeu_si512(dst.wrapping_add(written).cast(), packed) };
            written += m.count_ones() as usize;
        }
        // SAFETY: the first `written` entries past `len` were just initialized.
        unsafe { out.set_len(len + written) };
    }

    /// [`super::collect`]: the single tokens of the groups come out of the sample with one
    /// compress per half block, the groups holding several are read from the row.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `keys` and `pos` hold `GROUP_KEYS` entries per block of
    /// `row` (as [`super::scan`] writes them).
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn collect<T: FloatElement>(
        row: &[T],
        from: Collect<'_>,
        out: &mut Vec<Candidate>,
    ) -> bool {
        let (keys, pos, floor, cap) = (from.keys, from.pos, from.floor, from.cap);
        let floor_v = _mm512_set1_epi32(floor as i32);
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let threshold = _mm512_set1_ps(f32::from_bits(floor));
        // f32 rows re-read whole vectors; the float compare stands for the key compare only for a
        // positive floor at most the key of 1.0.
        let values = match (T::DTYPE, floor > 0 && floor <= super::ONE_KEY) {
            (specula_backend_api::DType::F32, true) => bytemuck::try_cast_slice::<T, f32>(row).ok(),
            _ => None,
        };
        for (b, (keys, pos)) in keys
            .chunks_exact(GROUP_KEYS)
            .zip(pos.chunks_exact(GROUP_KEYS))
            .enumerate()
        {
            // SAFETY: `keys` holds 32 u32 and `pos` 32 u8.
            let (max, second, first_pos) = unsafe {
                (
                    _mm512_loadu_si512(keys.as_ptr().cast()),
                    _mm512_loadu_si512(keys.as_ptr().add(GROUPS).cast()),
                    _mm_loadu_si128(pos.as_ptr().cast()),
                )
            };
            let first = _mm512_cmpge_epu32_mask(max, floor_v);
            if first == 0 {
                continue;
            }
            let several = _mm512_cmpge_epu32_mask(second, floor_v);
            let single = first & !several;
            let base = b * BLOCK;
            if single != 0 {
                // ids = base + 16·pos + lane
                let ids = _mm512_add_epi32(
                    _mm512_set1_epi32(base as i32),
                    _mm512_add_epi32(
                        _mm512_slli_epi32::<4>(_mm512_cvtepu8_epi32(first_pos)),
                        lanes,
                    ),
                );
                // SAFETY: as `push_pairs` requires.
                unsafe { push_pairs(max, ids, single, out) };
            }
            if several != 0 {
                match values {
                    Some(values) if base + BLOCK <= values.len() => {
                        // A full f32 block: compare every vector and keep the lanes of the groups
                        // holding several tokens (`floor` is a positive key at most that of 1.0,
                        // so `key(p) ≥ floor` is the ordered compare `p ≥ value(floor)`).
                        for q in 0..GROUPS {
                            let at = base + q * GROUPS;
                            // SAFETY: `at + 16 ≤ base + BLOCK ≤ values.len()`.
                            let v = unsafe { _mm512_loadu_ps(values.as_ptr().add(at)) };
                            let m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, threshold) & several;
                            if m == 0 {
                                continue;
                            }
                            let ids = _mm512_add_epi32(_mm512_set1_epi32(at as i32), lanes);
                            let keys = _mm512_castps_si512(sanitize(v));
                            // SAFETY: as `push_pairs` requires.
                            unsafe { push_pairs(keys, ids, m, out) };
                        }
                    }
                    _ => {
                        let mut several = u32::from(several);
                        while several != 0 {
                            let lane = several.trailing_zeros() as usize;
                            several &= several - 1;
                            for t in (base + lane..row.len().min(base + BLOCK)).step_by(GROUPS) {
                                let key = super::key_of(row[t]);
                                if key >= floor {
                                    out.push(Candidate { key, id: t as u32 });
                                }
                            }
                        }
                    }
                }
            }
            if out.len() > cap {
                return false;
            }
        }
        true
    }

    /// [`super::band_of`] with one compress per 16 keys.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn band_of(keys: &[u32], low: u32, high: u32, band: &mut Vec<u32>) {
        let (low_v, high_v) = (
            _mm512_set1_epi32(low as i32),
            _mm512_set1_epi32(high as i32),
        );
        let mut vectors = keys.chunks_exact(16);
        for v in &mut vectors {
            // SAFETY: `v` holds 16 u32.
            let k = unsafe { _mm512_loadu_si512(v.as_ptr().cast()) };
            let inside = _mm512_cmpge_epu32_mask(k, low_v) & _mm512_cmplt_epu32_mask(k, high_v);
            if inside == 0 {
                continue;
            }
            band.reserve(16);
            let len = band.len();
            // SAFETY: the capacity holds 16 entries past `len`; the lanes past the packed ones
            // stay beyond the length.
            unsafe {
                _mm512_storeu_si512(
                    band.as_mut_ptr().add(len).cast(),
                    _mm512_maskz_compress_epi32(inside, k),
                );
                band.set_len(len + inside.count_ones() as usize);
            }
        }
        band.extend(
            vectors
                .remainder()
                .iter()
                .copied()
                .filter(|&k| k >= low && k < high),
        );
    }

    /// [`super::level_totals_generic`] with mask registers.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn level_totals<const MASS: bool>(
        keys: &[u32],
        levels: &[u32; ROUND],
    ) -> ([u32; ROUND], [f64; ROUND]) {
        let level: [__m512i; ROUND] = std::array::from_fn(|j| _mm512_set1_epi32(levels[j] as i32));
        let one = _mm512_set1_epi32(1);
        let mut count = [_mm512_setzero_si512(); ROUND];
        let mut mass = [_mm512_setzero_pd(); ROUND];
        let mut vectors = keys.chunks_exact(16);
        let mut pending = 0;
        let mut partial = [_mm512_setzero_ps(); ROUND];
        for v in &mut vectors {
            // SAFETY: `v` holds 16 u32.
            let k = unsafe { _mm512_loadu_si512(v.as_ptr().cast()) };
            let value = _mm512_castsi512_ps(k);
            for j in 0..ROUND {
                let at_or_above = _mm512_cmpge_epu32_mask(k, level[j]);
                if MASS {
                    partial[j] = _mm512_mask_add_ps(partial[j], at_or_above, partial[j], value);
                } else {
                    count[j] = _mm512_mask_add_epi32(count[j], at_or_above, count[j], one);
                }
            }
            pending += 1;
            if MASS && pending == 64 {
                flush(&mut partial, &mut mass);
                pending = 0;
            }
        }
        flush(&mut partial, &mut mass);
        let mut out_count = [0u32; ROUND];
        let mut out_mass = [0f64; ROUND];
        for j in 0..ROUND {
            out_count[j] = _mm512_reduce_add_epi32(count[j]) as u32;
            out_mass[j] = _mm512_reduce_add_pd(mass[j]);
            for &k in vectors.remainder() {
                if k >= levels[j] {
                    out_count[j] += 1;
                    out_mass[j] += f64::from(f32::from_bits(k));
                }
            }
        }
        (out_count, out_mass)
    }

    /// Adds f32 partial sums into f64 totals and clears them.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt,bmi1,bmi2,lzcnt")]
    fn flush(partial: &mut [__m512; ROUND], mass: &mut [__m512d; ROUND]) {
        for j in 0..ROUND {
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(partial[j]));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(partial[j]),
            )));
            mass[j] = _mm512_add_pd(mass[j], _mm512_add_pd(lo, hi));
            partial[j] = _mm512_setzero_ps();
        }
    }
}

/// Parts of a row segment the vector passes of [`scan`] read side by side, a block of each in
/// turn: four memory streams in flight instead of one (as `max_and_clean` in
/// `sampling/logits/lanes.rs`), when they compute the weights only (top-p 1) or the group sample
/// only (top-k); the pass that computes both (top-p < 1) reads the row in order: one thread, 32
/// cold rows, it lost with four streams (+4 %) where the others gained 17–20 %
/// (`docs/bench/stop40-streams-probe.txt`). Every block's weight and group sample depend on that
/// block alone and the total is an integer sum, so the order changes nothing.
#[cfg(target_arch = "x86_64")]
fn streams_for(weights: bool, sample: bool) -> usize {
    if weights && sample { 1 } else { 4 }
}

/// The order the vector passes read `blocks` full blocks in: with `streams` > 1, block `j` of
/// each of `streams` equal parts in turn, then the blocks past the parts in order; else in order.
/// Every block once.
#[cfg(target_arch = "x86_64")]
fn block_order(blocks: usize, streams: usize) -> impl Iterator<Item = usize> {
    let part = blocks / streams.max(1);
    (0..part)
        .flat_map(move |j| (0..streams).map(move |p| p * part + j))
        .chain(streams * part..blocks)
}

/// The number of blocks of `len` tokens and of group keys [`scan`] keeps for them.
pub(crate) fn block_counts(len: usize) -> (usize, usize) {
    let blocks = len.div_ceil(BLOCK);
    (blocks, blocks * GROUP_KEYS)
}

/// What [`scan`] must compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Block weights and the total (top_p = 1).
    Weights,
    /// The group sample (top-k).
    Sample,
    /// Both (top-p, candidates).
    Both,
}

/// One streaming pass over a segment of a row that starts on a block boundary: writes the exact
/// weight of each block to `block_mass` and the two largest keys of each group, with their
/// positions, to `sample` (sized by [`block_counts`]; only what `need` asks for), and returns the
/// exact total weight (0 when weights are not asked for).
pub(crate) fn scan<T: FloatElement>(
    row: &[T],
    block_mass: &mut [u64],
    sample: GroupSample<'_>,
    need: Need,
) -> u64 {
    match need {
        Need::Weights => scan_with::<T, true, false>(row, block_mass, sample),
        Need::Sample => scan_with::<T, false, true>(row, block_mass, sample),
        Need::Both => scan_with::<T, true, true>(row, block_mass, sample),
    }
}

fn scan_with<T: FloatElement, const W: bool, const S: bool>(
    row: &[T],
    block_mass: &mut [u64],
    sample: GroupSample<'_>,
) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if let (DType::F32, Ok(values)) = (T::DTYPE, bytemuck::try_cast_slice::<T, f32>(row)) {
        if has_avx512() {
            return with_full_blocks::<W, S>(values, block_mass, sample, |head, mass, sample| {
                // SAFETY: AVX-512F is present; the slices are sized as the function requires.
                unsafe { avx512::scan_full_blocks::<W, S>(head, mass, sample) }
            });
        }
        if has_avx2() {
            return with_full_blocks::<W, S>(values, block_mass, sample, |head, mass, sample| {
                // SAFETY: AVX2 is present; the slices are sized as the function requires.
                unsafe { avx2::scan_full_blocks::<W, S>(head, mass, sample) }
            });
        }
    }
    let total =
        dispatch!(scan_generic::<T, W, S>(row, block_mass, sample) via scan_avx512, scan_avx2);
    if W { total } else { 0 }
}

/// An f32 row segment scanned by an intrinsics loop over its full blocks (`full_blocks`) and the
/// generic loop over the partial block at the end.
#[cfg(target_arch = "x86_64")]
fn with_full_blocks<const W: bool, const S: bool>(
    values: &[f32],
    block_mass: &mut [u64],
    mut sample: GroupSample<'_>,
    full_blocks: impl FnOnce(&[f32], &mut [u64], GroupSample<'_>) -> u64,
) -> u64 {
    let full = values.len() / BLOCK;
    let (head, tail) = values.split_at(full * BLOCK);
    let (head_mass, tail_mass) = block_mass.split_at_mut(full);
    let head_total = full_blocks(head, head_mass, sample.at_block(0));
    let tail_total = scan_generic::<f32, W, S>(tail, tail_mass, sample.at_block(full));
    if W { head_total + tail_total } else { 0 }
}

/// The lanes (bit l for group l) whose key in `keys` (at least 16) reaches `floor`.
#[inline(always)]
fn lanes_at_or_above(keys: &[u32], floor: u32) -> u32 {
    let keys: &[u32; GROUPS] = match keys.get(..GROUPS).and_then(|k| k.try_into().ok()) {
        Some(k) => k,
        None => return 0,
    };
    let mut mask = 0u32;
    for (lane, &key) in keys.iter().enumerate() {
        mask |= u32::from(key >= floor) << lane;
    }
    mask
}

/// Appends every token of `row` whose key reaches `floor` to `out`, block by block (ascending
/// blocks; within a block in no particular order), from the
/// sample [`scan`] kept (`keys` and `pos`): a group whose largest key is below the floor holds no
/// such token; one whose second largest is below it holds exactly one, at the recorded position;
/// only the rest (groups with two or more) are read from the row again. Returns `false` as soon as
/// `out` holds more than `cap` entries.
pub(crate) fn collect<T: FloatElement>(
    row: &[T],
    from: Collect<'_>,
    out: &mut Vec<Candidate>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: AVX-512F is present.
            return unsafe { avx512::collect(row, from, out) };
        }
        if has_avx2() {
            // SAFETY: the CPU supports the features the variant is compiled for.
            return unsafe { collect_avx2(row, from, out) };
        }
    }
    collect_generic(row, from, out)
}

/// What [`collect`] reads besides the row: the sample [`scan`] kept (`keys` and `pos`, as
/// [`GroupSample`] holds them), the `floor` a token's key must reach, and the most entries (`cap`)
/// it may gather.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Collect<'a> {
    /// The two largest keys of each group.
    pub keys: &'a [u32],
    /// The position of each of those keys within its group.
    pub pos: &'a [u8],
    /// The smallest key gathered.
    pub floor: u32,
    /// The most entries gathered before [`collect`] gives up.
    pub cap: usize,
}

compiled_for!(avx2, fn collect_avx2 [T: FloatElement]
    (row: &[T], from: Collect<'_>, out: &mut Vec<Candidate>) -> bool = collect_generic [T]);

#[inline(always)]
fn collect_generic<T: FloatElement>(
    row: &[T],
    from: Collect<'_>,
    out: &mut Vec<Candidate>,
) -> bool {
    let (keys, pos, floor, cap) = (from.keys, from.pos, from.floor, from.cap);
    for (b, (keys, pos)) in keys
        .chunks_exact(GROUP_KEYS)
        .zip(pos.chunks_exact(GROUP_KEYS))
        .enumerate()
    {
        let first = lanes_at_or_above(&keys[..GROUPS], floor);
        if first == 0 {
            continue;
        }
        let several = lanes_at_or_above(&keys[GROUPS..], floor);
        let base = b * BLOCK;
        let mut single = first & !several;
        while single != 0 {
            let lane = single.trailing_zeros() as usize;
            single &= single - 1;
            out.push(Candidate {
                key: keys[lane],
                id: (base + usize::from(pos[lane]) * GROUPS + lane) as u32,
            });
        }
        let mut several = several;
        while several != 0 {
            let lane = several.trailing_zeros() as usize;
            several &= several - 1;
            for t in (base + lane..row.len().min(base + BLOCK)).step_by(GROUPS) {
                let key = key_of(row[t]);
                if key >= floor {
                    out.push(Candidate { key, id: t as u32 });
                }
            }
        }
        if out.len() > cap {
            return false;
        }
    }
    true
}

/// Levels per round of [`level_totals`].
pub(crate) const ROUND: usize = 8;

/// For each of `levels`, the number of `keys` at or above it and their approximate mass (the sum of
/// the values the keys stand for: f32 partial sums over at most 64 keys per lane, added in f64).
#[inline(always)]
fn level_totals_generic(keys: &[u32], levels: &[u32; ROUND]) -> ([u32; ROUND], [f64; ROUND]) {
    let mut count = [0u32; ROUND];
    let mut mass = [0f64; ROUND];
    for chunk in keys.chunks(LANES * 64) {
        let mut c = [[0u32; LANES]; ROUND];
        let mut m = [[0f32; LANES]; ROUND];
        let mut vectors = chunk.chunks_exact(LANES);
        for v in &mut vectors {
            for j in 0..ROUND {
                for lane in 0..LANES {
                    let at_or_above = v[lane] >= levels[j];
                    c[j][lane] += u32::from(at_or_above);
                    m[j][lane] += if at_or_above {
                        f32::from_bits(v[lane])
                    } else {
                        0.0
                    };
                }
            }
        }
        for j in 0..ROUND {
            count[j] += c[j].iter().sum::<u32>();
            mass[j] += f64::from(m[j].iter().sum::<f32>());
            for &k in vectors.remainder() {
                if k >= levels[j] {
                    count[j] += 1;
                    mass[j] += f64::from(f32::from_bits(k));
                }
            }
        }
    }
    (count, mass)
}

compiled_for!(avx2, fn level_totals_avx2 [] (keys: &[u32], levels: &[u32; ROUND])
    -> ([u32; ROUND], [f64; ROUND]) = level_totals_generic []);

/// See [`level_totals_generic`]; with `mass` false only the counts are right (the AVX-512 loop
/// skips the masses), with `mass` true only the masses.
fn level_totals(keys: &[u32], levels: &[u32; ROUND], mass: bool) -> ([u32; ROUND], [f64; ROUND]) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU supports the features the loop is compiled for.
            return unsafe {
                if mass {
                    avx512::level_totals::<true>(keys, levels)
                } else {
                    avx512::level_totals::<false>(keys, levels)
                }
            };
        }
        if has_avx2() {
            // SAFETY: as above.
            return unsafe { level_totals_avx2(keys, levels) };
        }
    }
    level_totals_generic(keys, levels)
}

/// What a floor must let through.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Want {
    /// At least this many keys.
    Count(usize),
    /// At least this much probability mass (approximate).
    Mass(f64),
}

/// A high floor key such that the `keys` at or above it reach `want`: searched on a grid of keys
/// (rank keys are monotone in the value, and linear steps in them are nearly geometric steps in
/// the value) in three rounds of [`ROUND`] levels — 4 binary orders of magnitude apart from 1.0
/// down to 2^-28, then an eighth, then a sixty-fourth of that — so the floor is within a factor
/// 2^(1/16) of the highest possible one. `None` when even 2^-28 does not reach it.
pub(crate) fn floor_for(keys: &[u32], want: Want, band: &mut Vec<u32>) -> Option<u32> {
    let mass_wanted = matches!(want, Want::Mass(_));
    let reaches = |count: u32, mass: f64| match want {
        Want::Count(k) => count as usize >= k,
        Want::Mass(m) => mass >= m,
    };
    let mut step = 4u32 << 23;
    let levels: [u32; ROUND] = std::array::from_fn(|j| ONE_KEY.saturating_sub(j as u32 * step));
    let (count, mass) = level_totals(keys, &levels, mass_wanted);
    let j = (0..ROUND).find(|&j| reaches(count[j], mass[j]))?;
    if j == 0 {
        return Some(levels[0]);
    }
    // The highest reaching floor lies in [levels[j], levels[j − 1]): the later rounds look only
    // at the keys in that band, on top of the keys above it.
    let (low, high) = (levels[j], levels[j - 1]);
    let (above_count, above_mass) = (count[j - 1], mass[j - 1]);
    band_of(keys, low, high, band);
    let mut floor = low;
    let mut top = high;
    for _ in 0..2 {
        step /= 8;
        top -= step;
        let levels: [u32; ROUND] = std::array::from_fn(|j| top.saturating_sub(j as u32 * step));
        let (count, mass) = level_totals(band, &levels, mass_wanted);
        let Some(j) = (0..ROUND).find(|&j| reaches(above_count + count[j], above_mass + mass[j]))
        else {
            // The estimate rounds differently from the first round's: keep its level.
            return Some(floor);
        };
        floor = levels[j];
        if j == 0 {
            break;
        }
        top = levels[j - 1];
    }
    Some(floor)
}

/// The keys in `[low, high)`, into `band`.
pub(crate) fn band_of(keys: &[u32], low: u32, high: u32, band: &mut Vec<u32>) {
    band.clear();
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F is present.
        unsafe { avx512::band_of(keys, low, high, band) };
        return;
    }
    band.extend(keys.iter().copied().filter(|&k| k >= low && k < high));
}

/// The argmax order as an unsigned key: NaN lowest (0), −0.0 equal to +0.0, otherwise the order of
/// the values.
#[inline(always)]
pub(crate) fn argmax_key<T: FloatElement>(v: T) -> u32 {
    // Adding +0.0 turns −0.0 into +0.0 and leaves every other value as it is.
    let v = v.to_f32() + 0.0;
    let bits = v.to_bits();
    // Negative values: all bits flipped; non-negative: the sign bit set.
    let key = bits ^ (((bits as i32) >> 31) as u32 | 0x8000_0000);
    if v.is_nan() { 0 } else { key }
}

#[inline(always)]
fn argmax_generic<T: FloatElement>(row: &[T]) -> usize {
    let mut best_key = 0u32;
    let mut best_block = 0usize;
    let mut found = false;
    for (b, block) in row.chunks(BLOCK).enumerate() {
        let mut max = [0u32; LANES];
        let mut chunks = block.chunks_exact(LANES);
        for chunk in &mut chunks {
            for lane in 0..LANES {
                max[lane] = max[lane].max(argmax_key(chunk[lane]));
            }
        }
        let mut block_max = max.iter().copied().fold(0, u32::max);
        for &v in chunks.remainder() {
            block_max = block_max.max(argmax_key(v));
        }
        if !found || block_max > best_key {
            found = true;
            best_key = block_max;
            best_block = b;
        }
    }
    let start = best_block * BLOCK;
    row[start..]
        .iter()
        .take(BLOCK)
        .position(|&v| argmax_key(v) == best_key)
        .map_or(0, |i| start + i)
}

compiled_for!(avx512, fn argmax_avx512 [T: FloatElement] (row: &[T]) -> usize
    = argmax_generic [T]);
compiled_for!(avx2, fn argmax_avx2 [T: FloatElement] (row: &[T]) -> usize = argmax_generic [T]);

/// The first token of `row` with the largest value in argmax order (0 for an all-NaN or empty
/// row): a block maximum per [`BLOCK`] tokens, then one scan of the first block holding it.
pub(crate) fn argmax_row<T: FloatElement>(row: &[T]) -> usize {
    dispatch!(argmax_generic::<T>(row) via argmax_avx512, argmax_avx2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;
    use specula_backend_api::fixed_point::{key_weight, rank_key};

    /// The AVX2 pass writes what the generic loop writes: block weights, the two largest keys of
    /// each group and their positions, on rows with ties, NaN, negatives and values above 1, of
    /// 1 to 13 blocks; in order (weights and sample) and in four parts side by side (weights
    /// alone, sample alone).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_pass_equals_the_generic_loop() {
        if !has_avx2() {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let mut s = 99u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 33) as u32
        };
        for case in 0..40 {
            let len = BLOCK * (1 + case % 13);
            let row: Vec<f32> = (0..len)
                .map(|_| match next() % 23 {
                    0 => f32::NAN,
                    1 => -0.5,
                    2 => 1.5,
                    3 => 0.25, // ties
                    4 => 0.0,
                    _ => (next() % 1_000_000) as f32 * 1e-6 * [1.0, 1e-3, 1e-9][case % 3],
                })
                .collect();
            let (blocks, keys) = block_counts(len);
            let run = |avx2: bool| {
                let (mut mass, mut k, mut p) =
                    (vec![0u64; blocks], vec![0u32; keys], vec![0u8; keys]);
                let sample = GroupSample {
                    keys: &mut k,
                    pos: &mut p,
                };
                // SAFETY: AVX2 is present (checked above); the buffers are sized by block_counts.
                let total = if avx2 {
                    unsafe { avx2::scan_full_blocks::<true, true>(&row, &mut mass, sample) }
                } else {
                    scan_generic::<f32, true, true>(&row, &mut mass, sample)
                };
                (total, mass, k, p)
            };
            let want = run(false);
            assert!(run(true) == want, "case {case}");
            // The weights alone and the sample alone, which read the row's parts side by side.
            let (mut mass, mut k, mut p) = (vec![0u64; blocks], vec![0u32; keys], vec![0u8; keys]);
            let sample = GroupSample {
                keys: &mut k,
                pos: &mut p,
            };
            // SAFETY: as above.
            let total = unsafe { avx2::scan_full_blocks::<true, false>(&row, &mut mass, sample) };
            assert!((total, &mass) == (want.0, &want.1), "case {case}, weights");
            let sample = GroupSample {
                keys: &mut k,
                pos: &mut p,
            };
            // SAFETY: as above.
            unsafe { avx2::scan_full_blocks::<false, true>(&row, &mut mass, sample) };
            assert!((&k, &p) == (&want.2, &want.3), "case {case}, sample");
        }
    }

    #[test]
    fn branch_free_weight_matches_the_reference() {
        let mut key = 0u32;
        while key <= 0x3f80_0000 {
            assert_eq!(weight_of_key(key), key_weight(key), "key {key:#x}");
            key += 0x1357;
        }
        for key in [
            0,
            1,
            0x2b80_0000,
            0x2b7f_ffff,
            0x3f00_0000,
            0x3f7f_ffff,
            0x3f80_0000,
        ] {
            assert_eq!(weight_of_key(key), key_weight(key), "key {key:#x}");
        }
    }

    /// Hostile values: NaN, infinities, negatives, −0, subnormals, values above 1, ties.
    fn hostile_row(seed: u64, len: usize) -> Vec<f32> {
        let mut lcg = Lcg(seed);
        (0..len)
            .map(|i| {
                let u = lcg.unit();
                let x = lcg.0;
                match i % 11 {
                    0 => f32::NAN,
                    1 => -u,
                    2 => f32::from_bits((x >> 45) as u32), // subnormal or tiny
                    3 => 1.0 + u,
                    4 => 0.125,
                    5 if u < 0.01 => f32::INFINITY,
                    6 if u < 0.01 => f32::NEG_INFINITY,
                    7 => -0.0,
                    _ => u.powi(4) / 64.0,
                }
            })
            .collect()
    }

    fn reference_scan(row: &[f32]) -> (u64, Vec<u64>, Vec<u32>) {
        let block_mass = row
            .chunks(BLOCK)
            .map(|b| b.iter().map(|&v| key_weight(rank_key(v))).sum())
            .collect::<Vec<u64>>();
        let mut group_keys = vec![0u32; block_mass.len() * GROUP_KEYS];
        for (b, block) in row.chunks(BLOCK).enumerate() {
            for lane in 0..GROUPS {
                let mut keys: Vec<u32> = block
                    .iter()
                    .skip(lane)
                    .step_by(GROUPS)
                    .map(|&v| rank_key(v))
                    .collect();
                keys.sort_unstable_by(|a, b| b.cmp(a));
                group_keys[b * GROUP_KEYS + lane] = keys.first().copied().unwrap_or(0);
                group_keys[b * GROUP_KEYS + GROUPS + lane] = keys.get(1).copied().unwrap_or(0);
            }
        }
        (block_mass.iter().sum(), block_mass, group_keys)
    }

    /// Runs `scan` (or the generic loop) and checks it against the definition, positions
    /// included: the recorded tokens hold the recorded keys and are distinct.
    fn check_scan<T: FloatElement>(row: &[T], generic: bool) -> (Vec<u32>, Vec<u8>) {
        let widened: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
        let (total, blocks, keys) = reference_scan(&widened);
        let (nb, nk) = block_counts(row.len());
        let (mut bm, mut gk, mut gp) = (vec![0; nb], vec![0; nk], vec![0u8; nk]);
        let sample = GroupSample {
            keys: &mut gk,
            pos: &mut gp,
        };
        let got = if generic {
            scan_generic::<T, true, true>(row, &mut bm, sample)
        } else {
            scan(row, &mut bm, sample, Need::Both)
        };
        assert_eq!((got, &bm, &gk), (total, &blocks, &keys));
        // The partial passes compute their part the same way.
        let (mut bm2, mut gk2, mut gp2) = (vec![0; nb], vec![0; nk], vec![0u8; nk]);
        let only_weights = scan(
            row,
            &mut bm2,
            GroupSample {
                keys: &mut gk2,
                pos: &mut gp2,
            },
            Need::Weights,
        );
        assert_eq!((only_weights, &bm2), (total, &blocks));
        let (mut gk3, mut gp3) = (vec![0; nk], vec![0u8; nk]);
        scan(
            row,
            &mut bm2,
            GroupSample {
                keys: &mut gk3,
                pos: &mut gp3,
            },
            Need::Sample,
        );
        assert_eq!((&gk3, &gp3), (&gk, &gp));
        for b in 0..nb {
            for lane in 0..GROUPS {
                let id = |slot: usize| {
                    b * BLOCK + usize::from(gp[b * GROUP_KEYS + slot]) * GROUPS + lane
                };
                let (first, second) = (id(lane), id(GROUPS + lane));
                if first < row.len() {
                    assert_eq!(rank_key(widened[first]), gk[b * GROUP_KEYS + lane]);
                }
                if gk[b * GROUP_KEYS + GROUPS + lane] > 0 {
                    assert_ne!(first, second);
                    assert_eq!(
                        rank_key(widened[second]),
                        gk[b * GROUP_KEYS + GROUPS + lane]
                    );
                }
            }
        }
        (gk, gp)
    }

    /// The vector passes' block order visits every block once, each part's blocks in order,
    /// the parts side by side while they last.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_block_order_is_every_block_once() {
        for blocks in 0..40 {
            let order: Vec<usize> = block_order(blocks, 4).collect();
            assert!(
                block_order(blocks, 1).eq(0..blocks),
                "{blocks} blocks in order"
            );
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..blocks).collect::<Vec<_>>(), "{blocks} blocks");
            let part = blocks / 4;
            if part > 0 {
                assert_eq!(&order[..4], &[0, part, 2 * part, 3 * part], "{blocks}");
            }
        }
    }

    #[test]
    fn every_variant_of_scan_matches_the_definition() {
        for (seed, len) in [
            (1u64, 1usize),
            (2, 63),
            (3, 256),
            (4, 1000),
            (5, 5003),
            (6, 4096),
            // Around the vector passes' split into parts (four of whole blocks).
            (7, 4 * BLOCK - 1),
            (8, 5 * BLOCK),
            (9, 9 * BLOCK + 5),
            (10, 39 * BLOCK + 200),
        ] {
            let row = hostile_row(seed, len);
            check_scan(&row, false);
            check_scan(&row, true);
            let half: Vec<half::f16> = row.iter().map(|&v| half::f16::from_f32(v)).collect();
            check_scan(&half, false);
            // Ties: a row of a few distinct values.
            let ties: Vec<f32> = row
                .iter()
                .map(|&v| if v > 0.01 { 0.25 } else { 0.0 })
                .collect();
            check_scan(&ties, false);
            check_scan(&ties, true);
        }
    }

    #[test]
    fn collect_finds_every_token_at_or_above_the_floor() {
        let mut row = hostile_row(9, 3001);
        // Ties within groups, so that groups hold two or more tokens at the floor.
        for i in (0..row.len()).step_by(37) {
            row[i] = 0.125;
        }
        let (keys, pos) = check_scan(&row, false);
        for floor in [
            0u32,
            1,
            0x2b80_0000,
            0x3c00_0000,
            0x3e00_0000,
            0x3f80_0000,
            u32::MAX,
        ] {
            let mut got = Vec::new();
            let from = Collect {
                keys: &keys,
                pos: &pos,
                floor,
                cap: usize::MAX,
            };
            assert!(collect(&row, from, &mut got));
            // Grouped by block, in ascending blocks.
            assert!(
                got.windows(2)
                    .all(|w| w[0].id / BLOCK as u32 <= w[1].id / BLOCK as u32)
            );
            let mut generic = Vec::new();
            assert!(collect_generic(&row, from, &mut generic));
            assert!(
                generic
                    .windows(2)
                    .all(|w| w[0].id / BLOCK as u32 <= w[1].id / BLOCK as u32)
            );
            got.sort_unstable_by_key(|c| c.id);
            generic.sort_unstable_by_key(|c| c.id);
            assert_eq!(generic, got, "floor {floor:#x}");
            let expected: Vec<Candidate> = row
                .iter()
                .enumerate()
                .filter(|&(_, &v)| rank_key(v) >= floor)
                .map(|(i, &v)| Candidate {
                    key: rank_key(v),
                    id: i as u32,
                })
                .collect();
            assert_eq!(got, expected, "floor {floor:#x}");
        }
        let mut capped = Vec::new();
        let from = Collect {
            keys: &keys,
            pos: &pos,
            floor: 0,
            cap: 10,
        };
        assert!(!collect(&row, from, &mut capped));
    }

    #[test]
    fn floor_for_is_a_floor_that_reaches_the_want() {
        let row = hostile_row(21, 20_000);
        let keys: Vec<u32> = row.iter().map(|&v| rank_key(v)).collect();
        let above = |floor: u32| keys.iter().filter(|&&k| k >= floor).count();
        let mass = |floor: u32| -> f64 {
            keys.iter()
                .filter(|&&k| k >= floor)
                .map(|&k| f64::from(f32::from_bits(k)))
                .sum()
        };
        for k in [1usize, 2, 50, 1000, 5000] {
            let floor = floor_for(&keys, Want::Count(k), &mut Vec::new()).expect("reachable");
            assert!(above(floor) >= k, "k {k}");
            // Within a factor 2^(1/16) of the k-th largest key.
            let mut sorted = keys.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            assert!(
                f32::from_bits(floor) * 1.05 >= f32::from_bits(sorted[k - 1]),
                "k {k}"
            );
        }
        let total = mass(0);
        for frac in [0.01, 0.5, 0.9, 0.999] {
            let want = total * frac;
            let floor = floor_for(&keys, Want::Mass(want), &mut Vec::new()).expect("reachable");
            assert!(mass(floor) >= want * (1.0 - 1e-5), "frac {frac}");
        }
        assert_eq!(
            floor_for(&keys, Want::Count(keys.len() + 1), &mut Vec::new()),
            None
        );
        // The generic loop agrees with the dispatched one.
        let levels: [u32; ROUND] = std::array::from_fn(|j| 0x3f80_0000 - (j as u32) * (3 << 23));
        let (c1, _) = level_totals(&keys, &levels, false);
        let (_, m1) = level_totals(&keys, &levels, true);
        let (c2, m2) = level_totals_generic(&keys, &levels);
        assert_eq!(c1, c2);
        for j in 0..ROUND {
            assert!((m1[j] - m2[j]).abs() <= 1e-6 * m2[j].max(1.0));
        }
        assert_eq!(floor_for(&[], Want::Count(1), &mut Vec::new()), None);
    }

    #[test]
    fn argmax_follows_the_total_order() {
        let cases: Vec<(Vec<f32>, usize)> = vec![
            (vec![], 0),
            (vec![f32::NAN; 300], 0),
            (vec![f32::NAN, f32::NEG_INFINITY, f32::NAN], 1),
            (vec![-0.0, 0.0, -1.0], 0),
            (vec![-1.0, 0.0, -0.0], 1),
            (vec![1.0, f32::INFINITY, f32::INFINITY], 1),
        ];
        for (row, expected) in cases {
            assert_eq!(argmax_row(&row), expected, "{row:?}");
            assert_eq!(argmax_generic(&row), expected, "{row:?}");
        }
        for seed in 0..20 {
            let row = hostile_row(seed, 1 + seed as usize * 397);
            let mut best = 0;
            for i in 0..row.len() {
                if argmax_key(row[i]) > argmax_key(row[best]) {
                    best = i;
                }
            }
            assert_eq!(argmax_row(&row), best, "seed {seed}");
            let half: Vec<half::bf16> = row.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let mut best = 0;
            for i in 0..half.len() {
                if argmax_key(half[i]) > argmax_key(half[best]) {
                    best = i;
                }
            }
            assert_eq!(argmax_row(&half), best, "bf16 seed {seed}");
        }
    }
}
