//! A quantized matmul of the runner's own for Q4_1 weights, giving candle's bits faster.
//!
//! candle 0.11 has no SIMD dot product for Q4_1 (`BlockQ4_1::vec_dot` is the scalar
//! `vec_dot_unopt`), and 210 of SmolLM2-135M's 272 tensors are Q4_1: that dot product was three
//! quarters of the runner's time. [`Q4_1Matrix`] computes the same products:
//!
//! - at load, each weight row is repacked: its blocks' nibbles side by side, and each block's
//!   scale `d` and minimum `m` converted from f16 to f32 once (exact, so no bit changes);
//! - per call, each input row is quantized to Q8_1 by candle's own quantizer
//!   (`QTensor::quantize`, which runs `BlockQ8_1::from_float`, as candle's matmul does);
//! - each weight row (rayon, over chunks of rows) is dotted with **every** input row of the call
//!   while it is in cache, so a step of several tokens reads the weights once;
//! - the integer sum of each block is taken with AVX2 where the CPU has it (a scalar loop
//!   otherwise) — integer sums are exact in any order — and the blocks are accumulated in f32 in
//!   candle's order and formula, `sumf += sumi as f32 * d * d8 + m * s8`, block after block.
//!
//! So a [`Linear`] gives the same bits as candle's `QMatMul` on the same input
//! (`tests/model.rs` checks every Q4_1 tensor of the model), and the forward pass keeps the batch
//! invariance that speculative == plain needs: every output row is computed from its input row
//! alone, in an order that does not depend on how many rows the call has.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Result, Tensor};
use half::f16;
use rayon::prelude::*;

/// Values per Q4_1 and Q8_1 block.
const QK: usize = 32;
/// Bytes of a GGUF Q4_1 block: `d: f16`, `m: f16`, 16 bytes of nibbles.
const Q4_1_BYTES: usize = 20;
/// Bytes of a Q8_1 block: `d: f16`, `s: f16` (d times the sum of the values), 32 `i8`.
const Q8_1_BYTES: usize = 36;
/// Weight rows per rayon task.
const ROWS_PER_TASK: usize = 16;

/// Which matmul a model's Q4_1 weights go through (every other type goes through candle's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulKernel {
    /// [`Q4_1Matrix`]: the runner's own (the default).
    #[default]
    Runner,
    /// candle's `QMatMul`, as a reference and for comparison.
    Candle,
}

/// A linear layer `x · Wᵀ` over quantized weights `W: [out, in]`: Q4_1 weights by
/// [`Q4_1Matrix`], any other type by candle's [`QMatMul`].
#[derive(Debug)]
pub enum Linear {
    /// Q4_1 weights, repacked for the runner's matmul.
    Q4_1(Q4_1Matrix),
    /// Any other weights (and every weight under [`MatmulKernel::Candle`]).
    Candle(QMatMul),
}

impl Linear {
    /// A linear layer over `weight` (`[out, in]`), through `kernel` where it applies.
    pub fn new(weight: QTensor, kernel: MatmulKernel) -> Result<Self> {
        match (weight.dtype(), kernel) {
            (GgmlDType::Q4_1, MatmulKernel::Runner) => Ok(Self::Q4_1(Q4_1Matrix::new(&weight)?)),
            _ => Ok(Self::Candle(QMatMul::from_qtensor(weight)?)),
        }
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Q4_1(matrix) => matrix.forward(x),
            Self::Candle(matmul) => matmul.forward(x),
        }
    }
}

/// Q4_1 weights `[rows, cols]` repacked for [`Q4_1Matrix::forward`].
#[derive(Debug)]
pub struct Q4_1Matrix {
    rows: usize,
    cols: usize,
    /// Row after row, block after block, the 16 bytes of a block: byte `j` holds value `j` in
    /// its low nibble and value `j + 16` in its high nibble (GGUF's order).
    nibbles: Vec<u8>,
    /// Each block's scale `d`, as f32.
    scales: Vec<f32>,
    /// Each block's minimum `m`, as f32.
    mins: Vec<f32>,
}

impl Q4_1Matrix {
    /// Repacks a Q4_1 tensor of shape `[rows, cols]` (`cols` a multiple of 32).
    pub fn new(weight: &QTensor) -> Result<Self> {
        if weight.dtype() != GgmlDType::Q4_1 {
            candle_core::bail!("Q4_1Matrix of a {:?} tensor", weight.dtype());
        }
        let (rows, cols) = weight.shape().dims2()?;
        if !cols.is_multiple_of(QK) {
            candle_core::bail!("Q4_1 rows of {cols} values are not whole blocks");
        }
        let data = weight.data()?;
        let blocks = rows * cols / QK;
        if data.len() != blocks * Q4_1_BYTES {
            candle_core::bail!(
                "Q4_1 tensor [{rows}, {cols}] holds {} bytes, expected {}",
                data.len(),
                blocks * Q4_1_BYTES
            );
        }
        let mut matrix = Self {
            rows,
            cols,
            nibbles: Vec::with_capacity(blocks * QK / 2),
            scales: Vec::with_capacity(blocks),
            mins: Vec::with_capacity(blocks),
        };
        for block in data.chunks_exact(Q4_1_BYTES) {
            matrix.scales.push(f16_at(block, 0));
            matrix.mins.push(f16_at(block, 2));
            matrix.nibbles.extend_from_slice(&block[4..]);
        }
        Ok(matrix)
    }

    /// `x · Wᵀ` for `x` of shape `[..., cols]` (f32): `[..., rows]`, the bits of candle's
    /// `QMatMul::forward`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut dims = x.dims().to_vec();
        if x.dtype() != DType::F32 || dims.last() != Some(&self.cols) {
            candle_core::bail!(
                "Q4_1 matmul of [{}, {}] weights with a {:?} input of shape {dims:?}",
                self.rows,
                self.cols,
                x.dtype()
            );
        }
        let tokens = x.elem_count() / self.cols;
        let input = Q8_1Rows::quantize(&x.flatten_all()?.to_vec1()?, tokens, self.cols)?;
        let out = self.matmul(&input);
        if let Some(last) = dims.last_mut() {
            *last = self.rows;
        }
        Tensor::from_vec(out, dims, x.device())
    }

    /// The product, `[tokens, rows]` row-major.
    fn matmul(&self, input: &Q8_1Rows) -> Vec<f32> {
        let (tokens, blocks) = (input.tokens, self.cols / QK);
        let block_sums = block_sums_kernel();
        // Weight row major: a task writes its own rows' outputs for every token.
        let mut by_row = vec![0f32; self.rows * tokens];
        by_row
            .par_chunks_mut(ROWS_PER_TASK * tokens)
            .enumerate()
            .for_each(|(task, out)| {
                let mut sums = vec![0i32; tokens * blocks];
                for (i, out) in out.chunks_exact_mut(tokens).enumerate() {
                    let row = task * ROWS_PER_TASK + i;
                    let nibbles = &self.nibbles[row * blocks * QK / 2..][..blocks * QK / 2];
                    block_sums(nibbles, &input.values, &mut sums);
                    let scales = &self.scales[row * blocks..][..blocks];
                    let mins = &self.mins[row * blocks..][..blocks];
                    for (token, out) in out.iter_mut().enumerate() {
                        let at = token * blocks..(token + 1) * blocks;
                        *out = accumulate(
                            &sums[at.clone()],
                            scales,
                            mins,
                            &input.scales[at.clone()],
                            &input.sums[at],
                        );
                    }
                }
            });
        if tokens == 1 {
            return by_row;
        }
        let mut out = vec![0f32; tokens * self.rows];
        for (row, values) in by_row.chunks_exact(tokens).enumerate() {
            for (token, &value) in values.iter().enumerate() {
                out[token * self.rows + row] = value;
            }
        }
        out
    }
}

/// One dot product's blocks accumulated exactly as candle's `BlockQ4_1::vec_dot_unopt` does:
/// the same formula, the same association, block after block, no fused multiply-add.
fn accumulate(sums: &[i32], d: &[f32], m: &[f32], d8: &[f32], s8: &[f32]) -> f32 {
    let mut sumf = 0f32;
    for ((((&sumi, &d), &m), &d8), &s8) in sums.iter().zip(d).zip(m).zip(d8).zip(s8) {
        sumf += sumi as f32 * d * d8 + m * s8;
    }
    sumf
}

/// Input rows quantized to Q8_1 by candle, unpacked: the values, and each block's `d` and `s`
/// as f32.
struct Q8_1Rows {
    tokens: usize,
    values: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<f32>,
}

impl Q8_1Rows {
    /// Quantizes `tokens` rows of `cols` values with candle's `BlockQ8_1::from_float` (through
    /// `QTensor::quantize`, which applies it block after block, as candle's matmul does per row).
    fn quantize(values: &[f32], tokens: usize, cols: usize) -> Result<Self> {
        // A tensor of its own storage: `QTensor::quantize` reads the whole storage, whatever the
        // layout's offset.
        let x = Tensor::from_slice(values, (tokens, cols), &candle_core::Device::Cpu)?;
        let quantized = QTensor::quantize(&x, GgmlDType::Q8_1)?;
        let data = quantized.data()?;
        let blocks = tokens * cols / QK;
        if data.len() != blocks * Q8_1_BYTES {
            candle_core::bail!(
                "Q8_1 of [{tokens}, {cols}] holds {} bytes, expected {}",
                data.len(),
                blocks * Q8_1_BYTES
            );
        }
        let mut rows = Self {
            tokens,
            values: Vec::with_capacity(blocks * QK),
            scales: Vec::with_capacity(blocks),
            sums: Vec::with_capacity(blocks),
        };
        for block in data.chunks_exact(Q8_1_BYTES) {
            rows.scales.push(f16_at(block, 0));
            rows.sums.push(f16_at(block, 2));
            rows.values
                .extend(block[4..].iter().map(|&b| i8::from_ne_bytes([b])));
        }
        Ok(rows)
    }
}

/// The little-endian f16 at `at` of `bytes`, as f32 (exact).
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Integer block sums of one weight row against every input row: `nibbles` is the row's
/// `blocks` blocks (16 bytes each), `values` the Q8_1 values of every input row (`32 · blocks`
/// each), and `sums[token · blocks + b]` receives `Σ_j q4[b][j] · q8[token][b][j]`.
type BlockSums = fn(nibbles: &[u8], values: &[i8], sums: &mut [i32]);

/// The block sums for this CPU: AVX2 where it has it, scalar otherwise (the same integers).
fn block_sums_kernel() -> BlockSums {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return avx2::block_sums;
    }
    block_sums_scalar
}

/// Checks the lengths every [`BlockSums`] relies on.
fn check_lengths(nibbles: &[u8], values: &[i8], sums: &[i32]) {
    let blocks = nibbles.len() / (QK / 2);
    assert!(
        nibbles.len() == blocks * QK / 2 && values.len() == sums.len() * QK,
        "block sums of {} nibble bytes, {} values into {} sums",
        nibbles.len(),
        values.len(),
        sums.len()
    );
    assert!(blocks > 0 && sums.len().is_multiple_of(blocks));
}

/// [`BlockSums`] in plain Rust.
fn block_sums_scalar(nibbles: &[u8], values: &[i8], sums: &mut [i32]) {
    check_lengths(nibbles, values, sums);
    let blocks = nibbles.len() / (QK / 2);
    for (token_values, token_sums) in values
        .chunks_exact(blocks * QK)
        .zip(sums.chunks_exact_mut(blocks))
    {
        for ((x, y), sum) in nibbles
            .chunks_exact(QK / 2)
            .zip(token_values.chunks_exact(QK))
            .zip(token_sums.iter_mut())
        {
            let (low, high) = y.split_at(QK / 2);
            *sum = x
                .iter()
                .zip(low.iter().zip(high))
                .map(|(&x, (&y0, &y1))| {
                    i32::from(x & 0x0F) * i32::from(y0) + i32::from(x >> 4) * i32::from(y1)
                })
                .sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! [`BlockSums`](super::BlockSums) with AVX2: a block's 32 nibbles widened to bytes, times
    //! its 32 `i8` by `_mm256_maddubs_epi16` (at most 2 · 15 · 128 a pair: no saturation), pairs
    //! summed by `_mm256_madd_epi16`, and eight blocks' lanes summed at once by horizontal adds.

    use std::arch::x86_64::*;

    use super::{QK, check_lengths};

    /// [`BlockSums`](super::BlockSums); only called where the CPU has AVX2.
    pub(super) fn block_sums(nibbles: &[u8], values: &[i8], sums: &mut [i32]) {
        check_lengths(nibbles, values, sums);
        // SAFETY: `block_sums_kernel` hands this function out only after
        // `is_x86_feature_detected!("avx2")`, and the lengths it reads by are checked above.
        unsafe { block_sums_avx2(nibbles, values, sums) }
    }

    /// # Safety
    /// The CPU has AVX2; `nibbles` is `blocks · 16` bytes, `values` `sums.len() · 32`, and
    /// `sums.len()` a multiple of `blocks` (what `check_lengths` asserts).
    #[target_feature(enable = "avx2")]
    unsafe fn block_sums_avx2(nibbles: &[u8], values: &[i8], sums: &mut [i32]) {
        let blocks = nibbles.len() / (QK / 2);
        for (token_values, token_sums) in values
            .chunks_exact(blocks * QK)
            .zip(sums.chunks_exact_mut(blocks))
        {
            let mut b = 0;
            while b + 8 <= blocks {
                let mut lanes = [_mm256_setzero_si256(); 8];
                for (i, lane) in lanes.iter_mut().enumerate() {
                    // SAFETY: b + i < blocks, within both slices (see the function's contract).
                    *lane = unsafe { block_lanes(nibbles, token_values, b + i) };
                }
                let total = sum_lanes_of_eight(&lanes);
                // SAFETY: token_sums has `blocks` entries and b + 8 <= blocks.
                unsafe { _mm256_storeu_si256(token_sums.as_mut_ptr().add(b).cast(), total) };
                b += 8;
            }
            for (b, sum) in token_sums.iter_mut().enumerate().skip(b) {
                // SAFETY: b < blocks, within both slices.
                *sum = sum_lanes(unsafe { block_lanes(nibbles, token_values, b) });
            }
        }
    }

    /// The eight partial sums (four products each) of block `b`.
    ///
    /// # Safety
    /// The CPU has AVX2; `nibbles` holds at least `16 · (b + 1)` bytes and `values` at least
    /// `32 · (b + 1)`.
    #[target_feature(enable = "avx2")]
    unsafe fn block_lanes(nibbles: &[u8], values: &[i8], b: usize) -> __m256i {
        debug_assert!(nibbles.len() >= (b + 1) * QK / 2 && values.len() >= (b + 1) * QK);
        // SAFETY: 16 bytes at 16 · b and 32 bytes at 32 · b are in bounds (the contract);
        // unaligned loads.
        let (packed, y) = unsafe {
            (
                _mm_loadu_si128(nibbles.as_ptr().add(b * QK / 2).cast()),
                _mm256_loadu_si256(values.as_ptr().add(b * QK).cast()),
            )
        };
        // Values 0..16 are the low nibbles, 16..32 the high ones.
        let x = _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed),
            _mm256_set1_epi8(0x0F),
        );
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }

    /// The sum of the eight lanes of `v`.
    #[target_feature(enable = "avx2")]
    fn sum_lanes(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// The lane sums of eight vectors, in order, as one vector.
    #[target_feature(enable = "avx2")]
    fn sum_lanes_of_eight(v: &[__m256i; 8]) -> __m256i {
        // Per 128-bit half: [v0 (0+1), v0 (2+3), v1 (0+1), v1 (2+3)], and so on.
        let a = _mm256_hadd_epi32(v[0], v[1]);
        let b = _mm256_hadd_epi32(v[2], v[3]);
        let c = _mm256_hadd_epi32(v[4], v[5]);
        let d = _mm256_hadd_epi32(v[6], v[7]);
        // Low half: the low lanes' sums of v0..v3; high half: their high lanes' sums.
        let ab = _mm256_hadd_epi32(a, b);
        let cd = _mm256_hadd_epi32(c, d);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(ab, cd),
            _mm256_permute2x128_si256::<0x31>(ab, cd),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random byte stream (an LCG).
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn block_sums_of_this_cpu_equal_the_scalar_sums() {
        // 1, 7, 8, 18 and 48 blocks (the tail, a group of eight, both); 1 to 7 tokens; the
        // extremes of the values (-128, 127, nibbles 0 and 15) among random ones.
        for (blocks, tokens) in [(1, 1), (7, 3), (8, 2), (18, 5), (48, 7)] {
            let mut nibbles = bytes(blocks as u64, blocks * QK / 2);
            nibbles[0] = 0xFF;
            let mut values: Vec<i8> = bytes(99, tokens * blocks * QK)
                .into_iter()
                .map(|b| i8::from_ne_bytes([b]))
                .collect();
            values[0] = -128;
            values[QK / 2] = 127;
            let mut expected = vec![0; tokens * blocks];
            let mut got = vec![1; tokens * blocks];
            block_sums_scalar(&nibbles, &values, &mut expected);
            block_sums_kernel()(&nibbles, &values, &mut got);
            assert_eq!(got, expected, "{blocks} blocks, {tokens} tokens");
        }
        // A hand-computed block: nibbles (1, 2) in every byte against values 1..=32.
        let nibbles = vec![0x21; QK / 2];
        let values: Vec<i8> = (1..=32).collect();
        let mut sums = [0];
        block_sums_kernel()(&nibbles, &values, &mut sums);
        assert_eq!(sums[0], (1..=16).sum::<i32>() + 2 * (17..=32).sum::<i32>());
    }
}
