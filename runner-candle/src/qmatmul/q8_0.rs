//! The runner's matmul for Q8_0 weights (SmolLM2's tied embeddings / output head): the bits of
//! candle's AVX2 path, `candle_core::quantized::avx::vec_dot_q8_0_q8_0`, which candle takes
//! where the CPU has AVX2 and FMA — so it is only used there (candle's `QMatMul` elsewhere).
//!
//! Per weight row and input row, as candle: eight f32 lanes, each block adding
//! `fma(d_x · d_y, lane sum of four i8 products, acc)`, then candle's horizontal sum. What
//! differs is the work around it: the block scales converted from f16 once at load, the input
//! quantized once per call with the bits of candle's `BlockQ8_0::from_float` (`quantize.rs`),
//! each weight row's block dotted with up to three input rows while it is in a register, four
//! rows' chains interleaved (up to twelve accumulators in registers), and the lane sums by
//! AVX-512 VNNI where the CPU has it (the same integers; see the `avx2` module).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

use super::quantize::{Format, quantize};
use super::{QK, apply, f16_at, token_major};

/// Bytes of a Q8_0 block: `d: f16`, 32 `i8`.
const Q8_0_BYTES: usize = 34;
/// Weight rows dotted side by side (independent FMA chains).
const ROWS: usize = 4;
/// Weight rows per rayon task.
const ROWS_PER_TASK: usize = 64;

/// Q8_0 weights `[rows, cols]` unpacked for [`Q8_0Matrix::forward`].
#[derive(Debug)]
pub struct Q8_0Matrix {
    rows: usize,
    cols: usize,
    /// Row after row, block after block, the block's 32 values.
    values: Vec<i8>,
    /// Each block's scale as f32 (`[row][block]`).
    scales: Vec<f32>,
}

/// Q8_0 input rows, unpacked: values, and each block's scale as f32.
struct Q8_0Rows {
    tokens: usize,
    values: Vec<i8>,
    scales: Vec<f32>,
}

impl Q8_0Matrix {
    /// Whether `weight` can go through this matmul on this CPU: Q8_0, `[rows, cols]` with `rows`
    /// a multiple of 4 and `cols` of 32, and a CPU with AVX2 and FMA (where candle takes the
    /// path whose bits this matmul gives).
    pub fn fits(weight: &QTensor) -> bool {
        weight.dtype() == GgmlDType::Q8_0
            && has_avx2_fma()
            && weight
                .shape()
                .dims2()
                .is_ok_and(|(rows, cols)| rows.is_multiple_of(ROWS) && cols.is_multiple_of(QK))
    }

    /// Unpacks a Q8_0 tensor that [`Q8_0Matrix::fits`].
    pub fn new(weight: &QTensor) -> Result<Self> {
        if !Self::fits(weight) {
            candle_core::bail!(
                "Q8_0Matrix of a {:?} tensor of shape {:?} (AVX2 and FMA: {})",
                weight.dtype(),
                weight.shape(),
                has_avx2_fma()
            );
        }
        let (rows, cols) = weight.shape().dims2()?;
        let (values, scales) = unpack(&weight.data()?, rows, cols)?;
        Ok(Self {
            rows,
            cols,
            values,
            scales,
        })
    }

    /// `x · Wᵀ` for `x` of shape `[..., cols]` (f32): `[..., rows]`, the bits of candle's
    /// `QMatMul::forward` on a CPU with AVX2 and FMA.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        apply(x, "Q8_0", (self.rows, self.cols), |values, tokens| {
            Ok(self.matmul(&Q8_0Rows::quantize(values, tokens, self.cols)?))
        })
    }

    /// The product, `[tokens, rows]` row-major.
    fn matmul(&self, input: &Q8_0Rows) -> Vec<f32> {
        let (tokens, blocks) = (input.tokens, self.cols / QK);
        // `[row group][token][row of the group]`.
        let mut by_rows = vec![0f32; self.rows * tokens];
        by_rows
            .par_chunks_mut(ROWS_PER_TASK * tokens)
            .enumerate()
            .for_each(|(task, out)| {
                for (i, out) in out.chunks_exact_mut(ROWS * tokens).enumerate() {
                    let row = task * ROWS_PER_TASK + i * ROWS;
                    let values = &self.values[row * blocks * QK..][..ROWS * blocks * QK];
                    let scales = &self.scales[row * blocks..][..ROWS * blocks];
                    avx2::rows(values, scales, input, out);
                }
            });
        token_major(&by_rows, self.rows, tokens, ROWS)
    }
}

impl Q8_0Rows {
    /// Quantizes `tokens` rows of `cols` values (a multiple of 32) as candle's
    /// `BlockQ8_0::from_float` does (`quantize.rs`).
    fn quantize(values: &[f32], tokens: usize, cols: usize) -> Result<Self> {
        if values.len() != tokens * cols || !cols.is_multiple_of(QK) {
            candle_core::bail!("Q8_0 of {} values as [{tokens}, {cols}]", values.len());
        }
        let quantized = quantize(values, Format::Q8_0);
        Ok(Self {
            tokens,
            values: quantized.values,
            scales: quantized.scales,
        })
    }
}

/// The values and f32 scales of `rows` Q8_0 rows of `cols` values (`data`, GGUF's blocks).
fn unpack(data: &[u8], rows: usize, cols: usize) -> Result<(Vec<i8>, Vec<f32>)> {
    let blocks = rows * cols / QK;
    if data.len() != blocks * Q8_0_BYTES {
        candle_core::bail!(
            "Q8_0 [{rows}, {cols}] holds {} bytes, expected {}",
            data.len(),
            blocks * Q8_0_BYTES
        );
    }
    let mut values = Vec::with_capacity(blocks * QK);
    let mut scales = Vec::with_capacity(blocks);
    for block in data.chunks_exact(Q8_0_BYTES) {
        scales.push(f16_at(block, 0));
        values.extend(block[2..].iter().map(|&b| i8::from_ne_bytes([b])));
    }
    Ok((values, scales))
}

/// candle's test for its AVX2 Q8_0 dot product.
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! candle's `vec_dot_q8_0_q8_0` (AVX2 + FMA), instruction for instruction in its float
    //! part, for [`ROWS`] weight rows against every input row.
    //!
    //! Its integer part gives each 32-bit lane the sum of four products of weight and input
    //! values (`_mm256_maddubs_epi16` of `|x|` and `y` with `x`'s sign, then
    //! `_mm256_madd_epi16`; no pair can saturate, as candle's input values are within ±127).
    //! Where the CPU has AVX-512 VNNI the same sums come from one `_mm256_dpbusd_epi32`
    //! (unsigned times signed bytes, four a lane) of `x + 128` (the weight's bits with the top
    //! bit flipped) and `y`, started from `-128 · Σy` of the lane's four input values: the
    //! same integers, so the same bits after the float part.

    use std::arch::x86_64::*;

    use super::{Q8_0Rows, QK, ROWS};

    /// Dots `ROWS` weight rows (`values`, `scales`: `[row][block]`) with every input row:
    /// `out[token · ROWS + r]`. Only called for a matrix that fits, so on a CPU with AVX2 and
    /// FMA.
    pub(super) fn rows(values: &[i8], scales: &[f32], input: &Q8_0Rows, out: &mut [f32]) {
        let blocks = scales.len() / ROWS;
        assert!(
            blocks > 0
                && scales.len() == ROWS * blocks
                && values.len() == ROWS * blocks * QK
                && input.scales.len() == input.tokens * blocks
                && input.values.len() == input.tokens * blocks * QK
                && out.len() == input.tokens * ROWS,
            "Q8_0 rows of {blocks} blocks against {} input rows",
            input.tokens
        );
        rows_with(values, scales, input, out, has_vnni());
    }

    /// [`rows`] with the VNNI sums or the AVX2 ones (`vnni` only where [`has_vnni`]).
    pub(super) fn rows_with(
        values: &[i8],
        scales: &[f32],
        input: &Q8_0Rows,
        out: &mut [f32],
        vnni: bool,
    ) {
        assert!(super::has_avx2_fma(), "the Q8_0 matmul needs AVX2 and FMA");
        assert!(
            !vnni || has_vnni(),
            "the VNNI sums on a CPU without AVX-512 VNNI"
        );
        // SAFETY: the CPU has AVX2 and FMA (and VNNI where `vnni`: checked above), and the
        // lengths the functions read by are those `rows` checks.
        unsafe {
            if vnni {
                rows_vnni(values, scales, input, out)
            } else {
                rows_avx2_fma(values, scales, input, out)
            }
        }
    }

    /// Whether the CPU has AVX-512 VNNI on 256-bit vectors (see `qmatmul`'s kernel choice).
    fn has_vnni() -> bool {
        super::super::avx2::has_vnni()
    }

    /// [`has_vnni`], for the tests.
    #[cfg(test)]
    pub(super) fn has_vnni_for_test() -> bool {
        has_vnni()
    }

    /// # Safety
    /// The CPU has AVX2 and FMA; the lengths are those `rows` asserts.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2_fma(values: &[i8], scales: &[f32], input: &Q8_0Rows, out: &mut [f32]) {
        // SAFETY: as this function's.
        unsafe { rows_body::<2>(values, scales, input, out, no_offset, sums_maddubs) }
    }

    /// # Safety
    /// The CPU has AVX2, FMA, AVX-512 VNNI and VL; the lengths are those `rows` asserts.
    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    unsafe fn rows_vnni(values: &[i8], scales: &[f32], input: &Q8_0Rows, out: &mut [f32]) {
        // SAFETY: as this function's.
        unsafe { rows_body::<3>(values, scales, input, out, minus_128_sums, sums_dpbusd) }
    }

    /// The AVX2 sums need no offset.
    #[inline(always)]
    unsafe fn no_offset(_: __m256i) -> __m256i {
        // SAFETY: the caller runs with AVX2.
        unsafe { _mm256_setzero_si256() }
    }

    /// `-128 · Σy` of each lane's four input values.
    #[inline(always)]
    unsafe fn minus_128_sums(by: __m256i) -> __m256i {
        // SAFETY: the caller runs with AVX-512 VNNI and VL.
        unsafe {
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), by);
            _mm256_sub_epi32(_mm256_setzero_si256(), sums)
        }
    }

    /// candle's `mul_sum_i8_pairs` in integers: `|x|` times `y` with `x`'s sign, pairs of
    /// pairs summed.
    #[inline(always)]
    unsafe fn sums_maddubs(bx: __m256i, by: __m256i, _: __m256i) -> __m256i {
        // SAFETY: the caller runs with AVX2.
        unsafe {
            let ax = _mm256_sign_epi8(bx, bx);
            let sy = _mm256_sign_epi8(by, bx);
            let dot = _mm256_maddubs_epi16(ax, sy);
            _mm256_madd_epi16(_mm256_set1_epi16(1), dot)
        }
    }

    /// The same sums: `offset + Σ (x + 128) · y` by `_mm256_dpbusd_epi32`, `offset` being
    /// [`minus_128_sums`] of `by`.
    #[inline(always)]
    unsafe fn sums_dpbusd(bx: __m256i, by: __m256i, offset: __m256i) -> __m256i {
        // SAFETY: the caller runs with AVX-512 VNNI and VL.
        unsafe {
            let unsigned = _mm256_xor_si256(bx, _mm256_set1_epi8(-128));
            _mm256_dpbusd_epi32(offset, unsigned, by)
        }
    }

    /// `-128 · Σy` of each lane's input values (or nothing): see [`minus_128_sums`].
    type Offset = unsafe fn(__m256i) -> __m256i;
    /// A block's lane sums: see [`sums_maddubs`].
    type Sums = unsafe fn(__m256i, __m256i, __m256i) -> __m256i;

    /// The kernel's loop with `sums` for each block's lane sums (`offset` computed once per
    /// input block), over the input rows in runs of at most `MAX` (each run's [`ROWS`] ·
    /// `MAX` accumulators in registers); inlined into each `#[target_feature]` caller.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and what `offset` and `sums` need; the lengths are those `rows`
    /// asserts.
    #[inline(always)]
    unsafe fn rows_body<const MAX: usize>(
        values: &[i8],
        scales: &[f32],
        input: &Q8_0Rows,
        out: &mut [f32],
        offset: Offset,
        sums: Sums,
    ) {
        let mut first = 0;
        while first < input.tokens {
            let n = (input.tokens - first).min(MAX).min(3);
            let kernel = (values, scales, input, offset, sums);
            // SAFETY: as this function's; rows `first .. first + n` exist.
            unsafe {
                match n {
                    3 => run::<3>(kernel, out, first),
                    2 => run::<2>(kernel, out, first),
                    _ => run::<1>(kernel, out, first),
                }
            }
            first += n;
        }
    }

    /// Input rows `first .. first + N` against the [`ROWS`] weight rows, block after block,
    /// each (input row, weight row)'s accumulator in a register, then candle's horizontal sum.
    ///
    /// # Safety
    /// As [`rows_body`]'s, and `first + N <= input.tokens`.
    #[inline(always)]
    unsafe fn run<const N: usize>(
        (values, scales, input, offset, sums): (&[i8], &[f32], &Q8_0Rows, Offset, Sums),
        out: &mut [f32],
        first: usize,
    ) {
        let blocks = scales.len() / ROWS;
        // SAFETY (whole body): the features are the caller's contract; every read is within
        // the lengths `rows` asserted, as each comment says.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); ROWS]; N];
            for b in 0..blocks {
                let mut by = [_mm256_setzero_si256(); N];
                let mut off = [_mm256_setzero_si256(); N];
                for t in 0..N {
                    // Input row `first + t`'s block b is 32 bytes at a · 32 < values.len().
                    let a = (first + t) * blocks + b;
                    by[t] = _mm256_loadu_si256(input.values.as_ptr().add(a * QK).cast());
                    off[t] = offset(by[t]);
                }
                for r in 0..ROWS {
                    let w = r * blocks + b;
                    // Row r's block b is 32 bytes at w · 32 < values.len().
                    let bx = _mm256_loadu_si256(values.as_ptr().add(w * QK).cast());
                    for (t, acc) in acc.iter_mut().enumerate() {
                        let a = (first + t) * blocks + b;
                        let d = _mm256_set1_ps(scales[w] * input.scales[a]);
                        let q = _mm256_cvtepi32_ps(sums(bx, by[t], off[t]));
                        acc[r] = _mm256_fmadd_ps(d, q, acc[r]);
                    }
                }
            }
            for (t, acc) in acc.iter().enumerate() {
                for (r, &acc) in acc.iter().enumerate() {
                    out[(first + t) * ROWS + r] = hsum_float_8(acc);
                }
            }
        }
    }

    /// candle's `hsum_float_8`: the same adds in the same order.
    #[target_feature(enable = "avx2,fma")]
    fn hsum_float_8(x: __m256) -> f32 {
        let res = _mm256_extractf128_ps::<1>(x);
        let res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        let res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    //! No Q8_0 kernel off x86-64: [`Q8_0Matrix::fits`](super::Q8_0Matrix::fits) is false
    //! there, so no matrix is built and this is never called.

    use super::Q8_0Rows;

    /// Never called (see the module).
    pub(super) fn rows(_: &[i8], _: &[f32], _: &Q8_0Rows, _: &mut [f32]) {
        unreachable!("Q8_0Matrix::new refuses a CPU without AVX2 and FMA")
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::bytes;
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vnni_sums_give_the_avx2_bits() {
        if !has_avx2_fma() || !avx2::has_vnni_for_test() {
            eprintln!("skipped: this CPU has no AVX2+FMA or no AVX-512 VNNI");
            return;
        }
        // 18 blocks (the model's 576 columns), 3 input rows; weights over the whole i8 range
        // (-128 included), input values within ±127 as candle's quantizer gives them.
        let (blocks, tokens) = (18, 3);
        let values: Vec<i8> = bytes(1, ROWS * blocks * QK)
            .into_iter()
            .map(|b| i8::from_ne_bytes([b]))
            .collect();
        let scales: Vec<f32> = bytes(2, ROWS * blocks)
            .into_iter()
            .map(|b| f32::from(b) / 97.0)
            .collect();
        let mut input_values: Vec<i8> = bytes(3, tokens * blocks * QK)
            .into_iter()
            .map(|b| i8::from_ne_bytes([b]).max(-127))
            .collect();
        input_values[..4].copy_from_slice(&[-127, 127, -127, 127]);
        let input = Q8_0Rows {
            tokens,
            values: input_values,
            scales: bytes(4, tokens * blocks)
                .into_iter()
                .map(|b| f32::from(b) / 31.0)
                .collect(),
        };
        let (mut avx2, mut vnni) = (vec![0f32; tokens * ROWS], vec![1f32; tokens * ROWS]);
        avx2::rows_with(&values, &scales, &input, &mut avx2, false);
        avx2::rows_with(&values, &scales, &input, &mut vnni, true);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&vnni), bits(&avx2));
    }
}
