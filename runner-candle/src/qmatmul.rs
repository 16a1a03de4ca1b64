//! Quantized matmuls of the runner's own for the model's Q4_1 and Q8_0 weights, giving candle's
//! bits faster.
//!
//! candle 0.11 has no SIMD dot product for Q4_1 (`BlockQ4_1::vec_dot` is the scalar
//! `vec_dot_unopt`), and 210 of SmolLM2-135M's 272 tensors are Q4_1: that dot product was three
//! quarters of the runner's time. [`Q4_1Matrix`] computes the same products:
//!
//! - at load, the weights are repacked in groups of [`GROUP`] rows: the rows' nibbles of a block
//!   interleaved four bytes at a time (so that widened, each 32-bit lane holds one row's
//!   values), and each block's scale `d` and minimum `m` converted from f16 to f32 once (exact,
//!   so no bit changes);
//! - per call, each input row is quantized to Q8_1 with the bits of candle's own quantizer
//!   (`BlockQ8_1::from_float`, which candle's matmul runs on its input; `quantize.rs` gives the
//!   same values, scales and sums in vector instructions, and its tests compare the two);
//! - each group of weight rows (rayon, over chunks of groups) is dotted with **every** input row
//!   of the call while it is in cache, up to four input rows at a time with their accumulators
//!   in registers, so a step of several tokens reads the weights once;
//! - the integer sum of each block is taken with AVX-512 VNNI (`vpdpbusd`) or AVX2 where the
//!   CPU has them (a scalar loop otherwise; `SPECULA_CPU_MAX_ISA=avx2` keeps an AVX-512 CPU on
//!   AVX2) — integer sums are exact in any order — and the blocks are accumulated in f32 in
//!   candle's order and formula, `sumf += sumi as f32 * d * d8 + m * s8`, block after block,
//!   one weight row per f32 lane.
//!
//! The Q8_0 output head ([`Q8_0Matrix`], `q8_0.rs`) goes through candle's AVX2 dot product
//! already; the runner's copy of it (same instructions in the float part, the same integer
//! lane sums, by VNNI where the CPU has it) saves the f16 conversions and candle's thread pool,
//! where the CPU has AVX2 and FMA.
//!
//! So a [`Linear`] gives the same bits as candle's `QMatMul` on the same input
//! (`tests/model.rs` checks every Q4_1 and Q8_0 tensor of the model), and the forward pass keeps
//! the batch invariance that speculative == plain needs: every output row is computed from its
//! input row alone, in an order that does not depend on how many rows the call has.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Result, Tensor};
use half::f16;
use rayon::prelude::*;

mod q8_0;
mod quantize;

pub use q8_0::Q8_0Matrix;

/// Values per Q4_1 and Q8_1 block.
const QK: usize = 32;
/// Bytes of a GGUF Q4_1 block: `d: f16`, `m: f16`, 16 bytes of nibbles.
const Q4_1_BYTES: usize = 20;
/// Groups of weight rows per rayon task.
const GROUPS_PER_TASK: usize = 2;

/// Which matmul a model's Q4_1 and Q8_0 weights go through (every other type goes through
/// candle's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulKernel {
    /// [`Q4_1Matrix`] and [`Q8_0Matrix`]: the runner's own (the default).
    #[default]
    Runner,
    /// candle's `QMatMul`, as a reference and for comparison.
    Candle,
}

/// A linear layer `x · Wᵀ` over quantized weights `W: [out, in]`: Q4_1 weights by
/// [`Q4_1Matrix`], Q8_0 weights by [`Q8_0Matrix`] where it fits, anything else by candle's
/// [`QMatMul`].
#[derive(Debug)]
pub enum Linear {
    /// Q4_1 weights, repacked for the runner's matmul.
    Q4_1(Q4_1Matrix),
    /// Q8_0 weights, for the runner's matmul (on a CPU with AVX2 and FMA).
    Q8_0(Q8_0Matrix),
    /// Any other weights (and every weight under [`MatmulKernel::Candle`]).
    Candle(QMatMul),
}

impl Linear {
    /// A linear layer over `weight` (`[out, in]`), through `kernel` where it applies.
    pub fn new(weight: QTensor, kernel: MatmulKernel) -> Result<Self> {
        match (weight.dtype(), kernel) {
            (GgmlDType::Q4_1, MatmulKernel::Runner) if Q4_1Matrix::fits(&weight) => {
                Ok(Self::Q4_1(Q4_1Matrix::new(&weight)?))
            }
            (GgmlDType::Q8_0, MatmulKernel::Runner) if Q8_0Matrix::fits(&weight) => {
                Ok(Self::Q8_0(Q8_0Matrix::new(&weight)?))
            }
            _ => Ok(Self::Candle(QMatMul::from_qtensor(weight)?)),
        }
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Q4_1(matrix) => matrix.forward(x),
            Self::Q8_0(matrix) => matrix.forward(x),
            Self::Candle(matmul) => matmul.forward(x),
        }
    }
}

/// Linear layers over the same input (a layer's query, key and value projections; its gate and
/// up projections): one matmul over their stacked rows where all are Q4_1 for the runner's
/// matmul — the same bits, as every output is its own row's dot product, for one pass over the
/// input and one parallel call instead of several — else one [`Linear`] each.
#[derive(Debug)]
pub enum Projections {
    /// The weights stacked, and each projection's number of outputs.
    Stacked {
        /// The stacked rows.
        matrix: Q4_1Matrix,
        /// Each projection's rows, in order.
        outs: Vec<usize>,
    },
    /// One layer each.
    Separate(Vec<Linear>),
}

impl Projections {
    /// The projections over `weights` (each `[out_i, in]`), through `kernel` where it applies.
    pub fn new(weights: Vec<QTensor>, kernel: MatmulKernel) -> Result<Self> {
        let same_cols = weights.windows(2).all(|w| {
            w[0].shape().dims2().ok().map(|d| d.1) == w[1].shape().dims2().ok().map(|d| d.1)
        });
        if kernel == MatmulKernel::Runner && same_cols && weights.iter().all(Q4_1Matrix::fits) {
            let matrices = weights
                .iter()
                .map(Q4_1Matrix::new)
                .collect::<Result<Vec<_>>>()?;
            let outs = matrices.iter().map(|m| m.rows).collect();
            return Ok(Self::Stacked {
                matrix: Q4_1Matrix::stack(matrices)?,
                outs,
            });
        }
        let layers = weights
            .into_iter()
            .map(|w| Linear::new(w, kernel))
            .collect::<Result<_>>()?;
        Ok(Self::Separate(layers))
    }

    /// Each projection of `x` (`[..., in]`), in order: `[..., out_i]` each.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Self::Separate(layers) => layers.iter().map(|l| l.forward(x)).collect(),
            Self::Stacked { matrix, outs } => {
                let y = matrix.forward(x)?;
                let last = y.rank() - 1;
                let mut start = 0;
                outs.iter()
                    .map(|&n| {
                        let part = y.narrow(last, start, n)?.contiguous();
                        start += n;
                        part
                    })
                    .collect()
            }
        }
    }
}

/// Q4_1 weights `[rows, cols]` repacked for [`Q4_1Matrix::forward`], in groups of
/// [`GROUP`] rows whose blocks are dotted side by side.
#[derive(Debug)]
pub struct Q4_1Matrix {
    rows: usize,
    cols: usize,
    /// Group after group, block after block, the [`GROUP`] rows' 16 bytes of that block
    /// interleaved by [`LANE`] bytes: four chunks of 32 bytes, chunk `c` holding bytes
    /// `4c .. 4c + 4` of row 0, then of row 1, ... row 7. Byte `j` of a row's block holds value
    /// `j` in its low nibble and value `j + 16` in its high nibble (GGUF's order). So widened
    /// to bytes, the low nibbles of chunk `c` are values `4c .. 4c + 4` of each row, one row per
    /// 32-bit lane, and the high nibbles values `16 + 4c ..`.
    nibbles: Vec<u8>,
    /// Each block's scale `d` as f32, in the order of `nibbles` (`[group][block][row]`).
    scales: Vec<f32>,
    /// Each block's minimum `m` as f32, in the same order.
    mins: Vec<f32>,
}

/// Weight rows dotted side by side: one f32 lane of an AVX register each.
pub const GROUP: usize = 8;
/// Bytes of a row's block per 32-bit lane in the interleaved layout.
const LANE: usize = 4;

impl Q4_1Matrix {
    /// Repacks a Q4_1 tensor of shape `[rows, cols]` (`rows` a multiple of [`GROUP`], `cols`
    /// of 32).
    pub fn new(weight: &QTensor) -> Result<Self> {
        if weight.dtype() != GgmlDType::Q4_1 {
            candle_core::bail!("Q4_1Matrix of a {:?} tensor", weight.dtype());
        }
        let (rows, cols) = weight.shape().dims2()?;
        if !cols.is_multiple_of(QK) || !rows.is_multiple_of(GROUP) {
            candle_core::bail!(
                "Q4_1Matrix of [{rows}, {cols}]: rows must be whole groups of {GROUP}, columns whole blocks of {QK}"
            );
        }
        let data = weight.data()?;
        let blocks = cols / QK;
        if data.len() != rows * blocks * Q4_1_BYTES {
            candle_core::bail!(
                "Q4_1 tensor [{rows}, {cols}] holds {} bytes, expected {}",
                data.len(),
                rows * blocks * Q4_1_BYTES
            );
        }
        let mut matrix = Self {
            rows,
            cols,
            nibbles: Vec::with_capacity(rows * blocks * QK / 2),
            scales: Vec::with_capacity(rows * blocks),
            mins: Vec::with_capacity(rows * blocks),
        };
        for group in data.chunks_exact(GROUP * blocks * Q4_1_BYTES) {
            for b in 0..blocks {
                let block = |r: usize| &group[(r * blocks + b) * Q4_1_BYTES..][..Q4_1_BYTES];
                for r in 0..GROUP {
                    matrix.scales.push(f16_at(block(r), 0));
                    matrix.mins.push(f16_at(block(r), 2));
                }
                for chunk in 0..QK / 2 / LANE {
                    for r in 0..GROUP {
                        matrix
                            .nibbles
                            .extend_from_slice(&block(r)[4 + chunk * LANE..][..LANE]);
                    }
                }
            }
        }
        Ok(matrix)
    }

    /// The rows of `matrices` (of the same width) stacked in order: one matrix.
    pub fn stack(matrices: Vec<Q4_1Matrix>) -> Result<Self> {
        let mut parts = matrices.into_iter();
        let Some(mut stacked) = parts.next() else {
            candle_core::bail!("a stack of no Q4_1 matrix");
        };
        for part in parts {
            if part.cols != stacked.cols {
                candle_core::bail!(
                    "stacking Q4_1 rows of {} values on rows of {}",
                    part.cols,
                    stacked.cols
                );
            }
            // Whole groups: each group's layout is its own.
            stacked.rows += part.rows;
            stacked.nibbles.extend(part.nibbles);
            stacked.scales.extend(part.scales);
            stacked.mins.extend(part.mins);
        }
        Ok(stacked)
    }

    /// Whether `weight` can be repacked: Q4_1, `[rows, cols]` with `rows` a multiple of
    /// [`GROUP`] and `cols` of 32.
    pub fn fits(weight: &QTensor) -> bool {
        weight.dtype() == GgmlDType::Q4_1
            && weight
                .shape()
                .dims2()
                .is_ok_and(|(rows, cols)| rows.is_multiple_of(GROUP) && cols.is_multiple_of(QK))
    }

    /// `x · Wᵀ` for `x` of shape `[..., cols]` (f32): `[..., rows]`, the bits of candle's
    /// `QMatMul::forward`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        apply(x, "Q4_1", (self.rows, self.cols), |values, tokens| {
            Ok(self.matmul(&Q8_1Rows::quantize(values, tokens, self.cols)?))
        })
    }

    /// The product, `[tokens, rows]` row-major.
    fn matmul(&self, input: &Q8_1Rows) -> Vec<f32> {
        let (tokens, blocks) = (input.tokens, self.cols / QK);
        let kernel = group_kernel();
        let per_group = blocks * GROUP;
        // `[group][token][row of the group]`: a task writes its own groups for every token.
        let mut by_group = vec![0f32; self.rows * tokens];
        by_group
            .par_chunks_mut(GROUPS_PER_TASK * GROUP * tokens)
            .enumerate()
            .for_each(|(task, out)| {
                for (i, out) in out.chunks_exact_mut(GROUP * tokens).enumerate() {
                    let at = (task * GROUPS_PER_TASK + i) * per_group;
                    let group = Group {
                        nibbles: &self.nibbles[at * QK / 2..][..per_group * QK / 2],
                        scales: &self.scales[at..][..per_group],
                        mins: &self.mins[at..][..per_group],
                    };
                    kernel(&group, input, out);
                }
            });
        token_major(&by_group, self.rows, tokens, GROUP)
    }
}

/// `x · Wᵀ` for `x: [..., cols]` (f32) and `W: [rows, cols]` of type `what`, by `product` of
/// the input's values and number of rows (which gives `[tokens, rows]` row-major): the shape
/// checked, an input of no row answered without it.
fn apply(
    x: &Tensor,
    what: &str,
    (rows, cols): (usize, usize),
    product: impl FnOnce(&[f32], usize) -> Result<Vec<f32>>,
) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    if x.dtype() != DType::F32 || dims.last() != Some(&cols) {
        candle_core::bail!(
            "{what} matmul of [{rows}, {cols}] weights with a {:?} input of shape {dims:?}",
            x.dtype()
        );
    }
    let tokens = x.elem_count() / cols;
    if let Some(last) = dims.last_mut() {
        *last = rows;
    }
    if tokens == 0 {
        return Tensor::zeros(dims, DType::F32, x.device());
    }
    let out = product(&x.flatten_all()?.to_vec1()?, tokens)?;
    Tensor::from_vec(out, dims, x.device())
}

/// Outputs laid out `[row group][token][row of the group]` (groups of `group` rows), as
/// `[tokens, rows]` row-major.
fn token_major(by_group: &[f32], rows: usize, tokens: usize, group: usize) -> Vec<f32> {
    let mut out = vec![0f32; tokens * rows];
    for (g, values) in by_group.chunks_exact(group * tokens).enumerate() {
        for (token, values) in values.chunks_exact(group).enumerate() {
            out[token * rows + g * group..][..group].copy_from_slice(values);
        }
    }
    out
}

/// One group of [`GROUP`] weight rows, as [`Q4_1Matrix`] lays it out.
struct Group<'a> {
    nibbles: &'a [u8],
    scales: &'a [f32],
    mins: &'a [f32],
}

/// Dots a group with every input row: `out[token · GROUP + r]` receives row `r`'s dot with
/// input row `token`, accumulated block after block as candle's `BlockQ4_1::vec_dot_unopt`
/// does.
type GroupKernel = fn(group: &Group, input: &Q8_1Rows, out: &mut [f32]);

/// The kernel for this CPU: AVX-512 VNNI's integer dot products where it has them, AVX2 where
/// it has that, scalar otherwise (the same bits).
fn group_kernel() -> GroupKernel {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2::has_vnni() {
            return avx2::group_vnni;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return avx2::group;
        }
    }
    group_scalar
}

/// Checks the lengths every [`GroupKernel`] relies on: the group's blocks, the input's, and
/// `out` are consistent.
fn check_lengths(group: &Group, input: &Q8_1Rows, out: &[f32]) {
    let blocks = group.scales.len() / GROUP;
    assert!(
        blocks > 0
            && group.scales.len() == blocks * GROUP
            && group.mins.len() == blocks * GROUP
            && group.nibbles.len() == blocks * GROUP * QK / 2
            && input.scales.len() == input.tokens * blocks
            && input.sums.len() == input.tokens * blocks
            && input.values.len() == input.tokens * blocks * QK
            && out.len() == input.tokens * GROUP,
        "a Q4_1 group of {blocks} blocks against {} input rows of {} values",
        input.tokens,
        input.values.len() / input.tokens.max(1)
    );
}

/// [`GroupKernel`] in plain Rust: candle's loop, on the repacked layout.
fn group_scalar(group: &Group, input: &Q8_1Rows, out: &mut [f32]) {
    check_lengths(group, input, out);
    let blocks = group.scales.len() / GROUP;
    for (token, out) in out.chunks_exact_mut(GROUP).enumerate() {
        for (r, out) in out.iter_mut().enumerate() {
            let mut sumf = 0f32;
            for b in 0..blocks {
                let (w, a) = (b * GROUP + r, token * blocks + b);
                let block = &group.nibbles[b * GROUP * QK / 2..][..GROUP * QK / 2];
                let (y0, y1) = input.values[a * QK..][..QK].split_at(QK / 2);
                let sumi: i32 = (0..QK / 2)
                    .map(|j| {
                        let x = block[(j / LANE) * GROUP * LANE + r * LANE + j % LANE];
                        i32::from(x & 0x0F) * i32::from(y0[j])
                            + i32::from(x >> 4) * i32::from(y1[j])
                    })
                    .sum();
                sumf +=
                    sumi as f32 * group.scales[w] * input.scales[a] + group.mins[w] * input.sums[a];
            }
            *out = sumf;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! [`GroupKernel`](super::GroupKernel) with AVX2, and with AVX-512 VNNI where the CPU has
    //! it. For each block, the [`GROUP`] rows' nibbles (interleaved by four bytes, see
    //! [`Q4_1Matrix`](super::Q4_1Matrix)) are widened to eight vectors of bytes, vector `k`
    //! holding values `4k .. 4k + 4` of each row, one row per 32-bit lane. Then for each input
    //! row, its values `4k .. 4k + 4` broadcast to every lane are multiplied with vector `k` and
    //! summed into each lane's i32: with AVX2 by `_mm256_maddubs_epi16` (at most 2 · 15 · 128 =
    //! 3840 a pair), the eight products added as i16 (at most 30720: no overflow) and pairs
    //! summed by `_mm256_madd_epi16`; with VNNI by `_mm256_dpbusd_epi32`, four products a lane
    //! straight into i32 — either way each lane ends with the exact integer sum of its row's
    //! block. Those are accumulated lane by lane with candle's formula and association,
    //! `acc + ((sumi · d) · d8 + m · s8)`, separate multiplies and adds, no FMA: each lane gets
    //! the bits of candle's scalar loop.

    use std::arch::x86_64::*;

    use super::{GROUP, Group, LANE, Q8_1Rows, QK, check_lengths};

    /// Input values per block and lane step: the eight broadcast words of a block.
    const CHUNKS: usize = QK / 2 / LANE;

    /// Whether the CPU has AVX-512 VNNI on 256-bit vectors (and AVX2), and
    /// `SPECULA_CPU_MAX_ISA=avx2` (which keeps backend-cpu on its AVX2 loops too) does not keep
    /// the runner on the AVX2 kernel.
    pub(super) fn has_vnni() -> bool {
        static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *VNNI.get_or_init(|| {
            !std::env::var("SPECULA_CPU_MAX_ISA").is_ok_and(|isa| isa.eq_ignore_ascii_case("avx2"))
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
        })
    }

    /// [`GroupKernel`](super::GroupKernel); only handed out where the CPU has AVX2.
    pub(super) fn group(group: &Group, input: &Q8_1Rows, out: &mut [f32]) {
        check_lengths(group, input, out);
        // SAFETY: `group_kernel` hands this function out only after
        // `is_x86_feature_detected!("avx2")`, and the lengths it reads by are checked above.
        unsafe { group_avx2(group, input, out) }
    }

    /// [`GroupKernel`](super::GroupKernel); only handed out where [`has_vnni`].
    pub(super) fn group_vnni(group: &Group, input: &Q8_1Rows, out: &mut [f32]) {
        check_lengths(group, input, out);
        // SAFETY: `group_kernel` hands this function out only where `has_vnni()`, and the
        // lengths it reads by are checked above.
        unsafe { group_avx512_vnni(group, input, out) }
    }

    /// # Safety
    /// The CPU has AVX2, and the lengths are those `check_lengths` asserts.
    #[target_feature(enable = "avx2")]
    unsafe fn group_avx2(group: &Group, input: &Q8_1Rows, out: &mut [f32]) {
        // SAFETY: as this function's.
        unsafe { group_body::<2>(group, input, out, sum_maddubs) }
    }

    /// # Safety
    /// The CPU has AVX2, AVX-512 VNNI and AVX-512 VL, and the lengths are those
    /// `check_lengths` asserts.
    #[target_feature(enable = "avx2,avx512vnni,avx512vl")]
    unsafe fn group_avx512_vnni(group: &Group, input: &Q8_1Rows, out: &mut [f32]) {
        // SAFETY: as this function's.
        unsafe { group_body::<4>(group, input, out, sum_dpbusd) }
    }

    /// Each lane's exact integer sum of its row's block: the nibble vectors `x` times the
    /// input block's words `y` (word `k` broadcast against `x[k]`), by `_mm256_maddubs_epi16`.
    #[inline(always)]
    unsafe fn sum_maddubs(x: &[__m256i; 2 * CHUNKS], y: &[i32; 2 * CHUNKS]) -> __m256i {
        // SAFETY: the caller runs with AVX2 (`group_avx2`).
        unsafe {
            let mut pairs = _mm256_setzero_si256();
            for (&x, &y) in x.iter().zip(y) {
                pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(x, _mm256_set1_epi32(y)));
            }
            _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
        }
    }

    /// [`sum_maddubs`]'s sums by `_mm256_dpbusd_epi32` (unsigned nibbles times signed values,
    /// four a lane into i32; two chains to overlap their latency).
    #[inline(always)]
    unsafe fn sum_dpbusd(x: &[__m256i; 2 * CHUNKS], y: &[i32; 2 * CHUNKS]) -> __m256i {
        // SAFETY: the caller runs with AVX-512 VNNI and VL (`group_avx512_vnni`).
        unsafe {
            let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for k in (0..2 * CHUNKS).step_by(2) {
                even = _mm256_dpbusd_epi32(even, x[k], _mm256_set1_epi32(y[k]));
                odd = _mm256_dpbusd_epi32(odd, x[k + 1], _mm256_set1_epi32(y[k + 1]));
            }
            _mm256_add_epi32(even, odd)
        }
    }

    /// The sums of a block (see [`sum_maddubs`]).
    type BlockSums = unsafe fn(&[__m256i; 2 * CHUNKS], &[i32; 2 * CHUNKS]) -> __m256i;

    /// The kernel's loop, with `sum` for each block's integer sums, over the input rows in
    /// runs of at most `MAX` (each run's accumulators in registers); inlined into each
    /// `#[target_feature]` caller, so the intrinsics compile for its features.
    ///
    /// # Safety
    /// The CPU has AVX2 and what `sum` needs, and the lengths are those `check_lengths`
    /// asserts.
    #[inline(always)]
    unsafe fn group_body<const MAX: usize>(
        group: &Group,
        input: &Q8_1Rows,
        out: &mut [f32],
        sum: BlockSums,
    ) {
        let mut first = 0;
        while first < input.tokens {
            let n = (input.tokens - first).min(MAX).min(4);
            // SAFETY: as this function's; rows `first .. first + n` exist.
            unsafe {
                match n {
                    4 => run::<4>(group, input, out, sum, first),
                    3 => run::<3>(group, input, out, sum, first),
                    2 => run::<2>(group, input, out, sum, first),
                    _ => run::<1>(group, input, out, sum, first),
                }
            }
            first += n;
        }
    }

    /// Input rows `first .. first + N` against the group, block after block, each row's
    /// accumulator in a register.
    ///
    /// # Safety
    /// As [`group_body`]'s, and `first + N <= input.tokens`.
    #[inline(always)]
    unsafe fn run<const N: usize>(
        group: &Group,
        input: &Q8_1Rows,
        out: &mut [f32],
        sum: BlockSums,
        first: usize,
    ) {
        let blocks = group.scales.len() / GROUP;
        // SAFETY (whole body): the CPU has AVX2 (the caller's contract), and every read is
        // within the lengths `check_lengths` asserted, as each comment says.
        unsafe {
            let low = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..blocks {
                let mut x = [_mm256_setzero_si256(); 2 * CHUNKS];
                for c in 0..CHUNKS {
                    // Chunk c of block b is 32 bytes at (b · 4 + c) · 32 < nibbles.len().
                    let packed = _mm256_loadu_si256(
                        group
                            .nibbles
                            .as_ptr()
                            .add((b * CHUNKS + c) * GROUP * LANE)
                            .cast(),
                    );
                    x[c] = _mm256_and_si256(packed, low);
                    x[c + CHUNKS] = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low);
                }
                // GROUP f32 at b · GROUP are within scales and mins (blocks · GROUP each).
                let d = _mm256_loadu_ps(group.scales.as_ptr().add(b * GROUP));
                let m = _mm256_loadu_ps(group.mins.as_ptr().add(b * GROUP));
                for (t, acc) in acc.iter_mut().enumerate() {
                    let a = (first + t) * blocks + b;
                    // The 32 values of input row `first + t`'s block b (a · 32 + 32 <=
                    // values.len()), as eight words; an unaligned read.
                    let y = input
                        .values
                        .as_ptr()
                        .add(a * QK)
                        .cast::<[i32; 2 * CHUNKS]>()
                        .read_unaligned();
                    let sumi = _mm256_cvtepi32_ps(sum(&x, &y));
                    let term = _mm256_add_ps(
                        _mm256_mul_ps(_mm256_mul_ps(sumi, d), _mm256_set1_ps(input.scales[a])),
                        _mm256_mul_ps(m, _mm256_set1_ps(input.sums[a])),
                    );
                    // candle's `sumf += term`, from 0.
                    *acc = _mm256_add_ps(*acc, term);
                }
            }
            for (t, acc) in acc.iter().enumerate() {
                // Row `first + t`'s GROUP outputs are within `out` (tokens · GROUP).
                _mm256_storeu_ps(out.as_mut_ptr().add((first + t) * GROUP), *acc);
            }
        }
    }
}

/// Input rows quantized to Q8_1 with candle's bits (`quantize.rs`), unpacked: the values, and
/// each block's `d` and `s` as f32.
struct Q8_1Rows {
    tokens: usize,
    values: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<f32>,
}

impl Q8_1Rows {
    /// Quantizes `tokens` rows of `cols` values (a multiple of 32) as candle's
    /// `BlockQ8_1::from_float` does, block after block, as candle's matmul does per row.
    fn quantize(values: &[f32], tokens: usize, cols: usize) -> Result<Self> {
        if values.len() != tokens * cols || !cols.is_multiple_of(QK) {
            candle_core::bail!("Q8_1 of {} values as [{tokens}, {cols}]", values.len());
        }
        let quantized = quantize::quantize(values, quantize::Format::Q8_1);
        Ok(Self {
            tokens,
            values: quantized.values,
            scales: quantized.scales,
            sums: quantized.sums,
        })
    }
}

/// The little-endian f16 at `at` of `bytes`, as f32 (exact).
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random byte stream (an LCG); the submodules' tests use it too.
    pub(super) fn bytes(seed: u64, n: usize) -> Vec<u8> {
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

    /// Pseudo-random f32 of a few units from `bytes`.
    fn floats(seed: u64, n: usize) -> Vec<f32> {
        bytes(seed, n)
            .into_iter()
            .map(|b| (f32::from(b) - 100.0) / 37.0)
            .collect()
    }

    /// Pseudo-random Q8_1 input rows (`d` and `s` need not be consistent for the kernels).
    fn input(seed: u64, tokens: usize, blocks: usize) -> Q8_1Rows {
        let mut values: Vec<i8> = bytes(seed, tokens * blocks * QK)
            .into_iter()
            .map(|b| i8::from_ne_bytes([b]))
            .collect();
        values[0] = -128;
        values[QK / 2] = 127;
        Q8_1Rows {
            tokens,
            values,
            scales: floats(seed + 1, tokens * blocks),
            sums: floats(seed + 2, tokens * blocks),
        }
    }

    #[test]
    fn the_kernel_of_this_cpu_gives_the_scalar_bits() {
        // 1, 7, 8, 18 and 48 blocks; 1 to 7 input rows; the extremes of the values (-128, 127,
        // nibbles 0 and 15) among random ones.
        for (blocks, tokens) in [(1, 1), (7, 3), (8, 2), (18, 5), (48, 7)] {
            let mut nibbles = bytes(blocks as u64, blocks * GROUP * QK / 2);
            nibbles[0] = 0xFF;
            nibbles[1] = 0x00;
            let (scales, mins) = (floats(3, blocks * GROUP), floats(4, blocks * GROUP));
            let group = Group {
                nibbles: &nibbles,
                scales: &scales,
                mins: &mins,
            };
            let input = input(blocks as u64 + 10, tokens, blocks);
            let mut expected = vec![0f32; tokens * GROUP];
            group_scalar(&group, &input, &mut expected);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (name, kernel) in kernels_of_this_cpu() {
                let mut got = vec![1f32; tokens * GROUP];
                kernel(&group, &input, &mut got);
                assert_eq!(
                    bits(&got),
                    bits(&expected),
                    "{name}: {blocks} blocks, {tokens} tokens"
                );
            }
        }
    }

    /// Every kernel this CPU can run, by name (the one `group_kernel` picks among them).
    fn kernels_of_this_cpu() -> Vec<(&'static str, GroupKernel)> {
        let mut kernels: Vec<(&'static str, GroupKernel)> = vec![("scalar", group_scalar)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                kernels.push(("avx2", avx2::group));
            }
            if avx2::has_vnni() {
                kernels.push(("avx512 vnni", avx2::group_vnni));
            }
        }
        eprintln!(
            "Q4_1 group kernels checked: {:?}",
            kernels.iter().map(|k| k.0).collect::<Vec<_>>()
        );
        kernels
    }

    #[test]
    fn an_input_of_no_row_gives_an_output_of_no_row() -> Result<()> {
        let device = candle_core::Device::Cpu;
        let weights = Tensor::ones((GROUP, QK), DType::F32, &device)?;
        let q4_1 = Linear::new(
            QTensor::quantize(&weights, GgmlDType::Q4_1)?,
            MatmulKernel::Runner,
        )?;
        let q8_0 = Linear::new(
            QTensor::quantize(&weights, GgmlDType::Q8_0)?,
            MatmulKernel::Runner,
        )?;
        assert!(matches!(q4_1, Linear::Q4_1(_)));
        for layer in [q4_1, q8_0] {
            let empty = Tensor::zeros((1, 0, QK), DType::F32, &device)?;
            assert_eq!(layer.forward(&empty)?.dims(), [1, 0, GROUP]);
            let one = Tensor::ones((1, 1, QK), DType::F32, &device)?;
            assert_eq!(layer.forward(&one)?.dims(), [1, 1, GROUP]);
        }
        Ok(())
    }

    #[test]
    fn a_hand_computed_block() {
        // Row 0: nibbles (1, 2) in every byte, d = 0.5, m = 2; the other rows zero. Input:
        // values 1..=32, d8 = 0.25, s8 = 3. Sum: 1·(1+…+16) + 2·(17+…+32) = 136 + 784 = 920;
        // 920 · 0.5 · 0.25 + 2 · 3 = 121.
        let mut nibbles = vec![0u8; GROUP * QK / 2];
        for chunk in nibbles.chunks_exact_mut(GROUP * LANE) {
            chunk[..LANE].fill(0x21); // row 0's bytes of each chunk
        }
        let (mut scales, mut mins) = (vec![0f32; GROUP], vec![0f32; GROUP]);
        (scales[0], mins[0]) = (0.5, 2.0);
        let group = Group {
            nibbles: &nibbles,
            scales: &scales,
            mins: &mins,
        };
        let input = Q8_1Rows {
            tokens: 1,
            values: (1..=32).collect(),
            scales: vec![0.25],
            sums: vec![3.0],
        };
        let mut out = vec![f32::NAN; GROUP];
        group_kernel()(&group, &input, &mut out);
        assert_eq!(out, [121.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }
}
