//! The runner's matmul for Q8_0 weights (SmolLM2's tied embeddings / output head): the bits of
//! candle's AVX2 path, `candle_core::quantized::avx::vec_dot_q8_0_q8_0`, which candle takes
//! where the CPU has AVX2 and FMA — so it is only used there (candle's `QMatMul` elsewhere).
//!
//! Per weight row and input row, as candle: eight f32 lanes, each block adding
//! `fma(d_x · d_y, lane sum of four i8 products, acc)`, then candle's horizontal sum. What
//! differs is the work around it: the block scales converted from f16 once at load, the input
//! quantized once per call (candle's `BlockQ8_0::from_float`), each weight row dotted with every
//! input row while it is in cache, and four rows' chains interleaved.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};
use rayon::prelude::*;

use super::{QK, apply, candle_quantized, f16_at, token_major};

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
    /// Quantizes `tokens` rows of `cols` values with candle's `BlockQ8_0::from_float`.
    fn quantize(values: &[f32], tokens: usize, cols: usize) -> Result<Self> {
        let quantized = candle_quantized(values, tokens, cols, GgmlDType::Q8_0)?;
        let (values, scales) = unpack(&quantized.data()?, tokens, cols)?;
        Ok(Self {
            tokens,
            values,
            scales,
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
        assert!(super::has_avx2_fma(), "the Q8_0 matmul needs AVX2 and FMA");
        // SAFETY: the CPU has AVX2 and FMA, and the lengths the function reads by are checked
        // above.
        unsafe { rows_avx2_fma(values, scales, input, out) }
    }

    /// # Safety
    /// The CPU has AVX2 and FMA; the lengths are those `rows` asserts.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2_fma(values: &[i8], scales: &[f32], input: &Q8_0Rows, out: &mut [f32]) {
        let blocks = scales.len() / ROWS;
        for (token, out) in out.chunks_exact_mut(ROWS).enumerate() {
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for b in 0..blocks {
                let a = token * blocks + b;
                // SAFETY: input row `token`'s block b is 32 bytes at a · 32 < values.len().
                let by = unsafe { _mm256_loadu_si256(input.values.as_ptr().add(a * QK).cast()) };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let w = r * blocks + b;
                    let d = _mm256_set1_ps(scales[w] * input.scales[a]);
                    // SAFETY: row r's block b is 32 bytes at w · 32 < values.len().
                    let bx = unsafe { _mm256_loadu_si256(values.as_ptr().add(w * QK).cast()) };
                    // candle's mul_sum_i8_pairs_float: |x| times y with x's sign, pairs of
                    // pairs summed, as f32.
                    let ax = _mm256_sign_epi8(bx, bx);
                    let sy = _mm256_sign_epi8(by, bx);
                    let dot = _mm256_maddubs_epi16(ax, sy);
                    let q = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot));
                    *acc = _mm256_fmadd_ps(d, q, *acc);
                }
            }
            for (out, &acc) in out.iter_mut().zip(&acc) {
                *out = hsum_float_8(acc);
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
