//! The input of a matmul quantized to Q8_0 or Q8_1 block by block, with the bits of candle's
//! `BlockQ8_0::from_float` and `BlockQ8_1::from_float` (the functions candle's `QMatMul` runs on
//! its input), written so the compiler vectorises it.
//!
//! Per block of 32 values, as candle: `amax` the largest `|x|` (NaN passed over, as `f32::max`
//! does), `d = amax / 127`, `id = 1 / d` (0 where `d` is 0), each value `round(x · id)` (half
//! away from zero) converted to `i8` as Rust's `as` does (saturating, NaN to 0), `d` kept as
//! f16; for Q8_1 also `s = f16(Σ values) · f16(d)`. What differs is only how: the rounding is
//! `trunc` plus a correction (the same value as `f32::round` for every f32, NaN and ±∞
//! included), which compiles to vector instructions where `f32::round` is a call to `roundf`
//! per value; `amax` is taken over eight lanes and then across them (the largest of a set does
//! not depend on the order it is taken in); the integer sum is exact in any order.

use half::f16;

use super::QK;

/// Input rows quantized, unpacked: the values, each block's `d` (the f16 as f32) and, for
/// Q8_1, each block's `s` (likewise).
pub(super) struct Quantized {
    /// Every block's 32 values, row after row.
    pub values: Vec<i8>,
    /// Each block's `d`.
    pub scales: Vec<f32>,
    /// Each block's `s = f16(sum) · d` (Q8_1 only; empty for Q8_0).
    pub sums: Vec<f32>,
}

/// Which of candle's 8-bit input formats.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Format {
    /// `BlockQ8_0`: `d` and the values.
    Q8_0,
    /// `BlockQ8_1`: `d`, `s` and the values.
    Q8_1,
}

/// Quantizes `values` (rows of a multiple of [`QK`] values, so `values.len()` is one too) as
/// candle's `from_float` of `format`, block after block; the CPU's features are asked once a call.
pub(super) fn quantize(values: &[f32], format: Format) -> Quantized {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { quantize_avx2(values, format) };
    }
    quantize_blocks(values, format)
}

/// [`quantize_blocks`] compiled for AVX2 (so the block's loops become vector instructions).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(values: &[f32], format: Format) -> Quantized {
    quantize_blocks(values, format)
}

/// Every block of `values` by [`block_generic`], inlined into its caller.
#[inline(always)]
fn quantize_blocks(values: &[f32], format: Format) -> Quantized {
    let blocks = values.len() / QK;
    let mut out = Quantized {
        values: vec![0; blocks * QK],
        scales: Vec::with_capacity(blocks),
        sums: Vec::with_capacity(if format == Format::Q8_1 { blocks } else { 0 }),
    };
    for (xs, qs) in values.chunks_exact(QK).zip(out.values.chunks_exact_mut(QK)) {
        let (d, sum) = block_generic(xs, qs);
        out.scales.push(d.to_f32());
        if format == Format::Q8_1 {
            // candle's `ys.s = f16::from_f32(sum as f32) * ys.d`: an f16 product.
            out.sums.push((f16::from_f32(sum as f32) * d).to_f32());
        }
    }
    out
}

/// The block's quantization (see the module).
#[inline(always)]
fn block_generic(xs: &[f32], qs: &mut [i8]) -> (f16, i32) {
    let (xs, qs) = (&xs[..QK], &mut qs[..QK]);
    let mut lanes = [0f32; 8];
    for chunk in xs.chunks_exact(8) {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x.abs());
        }
    }
    let amax = lanes.iter().fold(0f32, |amax, &lane| amax.max(lane));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &x) in qs.iter_mut().zip(xs) {
        *q = round_half_away(x * id) as i8;
        sum += i32::from(*q);
    }
    (f16::from_f32(d), sum)
}

/// `f32::round` (half away from zero) as `trunc` and a correction: `v - trunc(v)` is exact, and
/// where its size is at least one half the result is one further from zero (for `|v| ≥ 2²³`
/// the difference is 0; for NaN the comparison is false and NaN stays NaN; for ±∞ the
/// difference is NaN and ±∞ stays).
#[inline(always)]
fn round_half_away(v: f32) -> f32 {
    let t = v.trunc();
    if (v - t).abs() >= 0.5 {
        t + 1f32.copysign(v)
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;

    /// Rows of 4 blocks: random values of several scales, and the cases where rounding and
    /// conversion have edges (halves, values just under a half, zeros, ±0, NaN, ±∞, subnormals,
    /// huge values).
    fn rows() -> Vec<f32> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let mut values = Vec::new();
        for scale in [1e-30, 1e-3, 1.0, 7.0, 1e4, 3e38] {
            values.extend((0..4 * QK).map(|_| next() * scale));
        }
        // A block whose amax is 127, so `id` is 1 and the values are exact halves.
        values.extend((0..QK).map(|i| if i == 0 { 127.0 } else { i as f32 - 0.5 }));
        values.extend((0..QK).map(|i| {
            if i == 0 {
                -127.0
            } else {
                0.49999997 * i as f32
            }
        }));
        values.extend([0.0; QK]);
        values.extend((0..QK).map(|i| if i % 2 == 0 { -0.0 } else { 0.0 }));
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE / 4.0,
        ];
        for special in specials {
            values.extend((0..QK).map(|i| {
                if i == 3 {
                    special
                } else {
                    i as f32 * 0.3 - 4.0
                }
            }));
        }
        values.extend([f32::NAN; QK]);
        values
    }

    /// The bits of `f32`s.
    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn round_half_away_is_f32_round() {
        let mut values = vec![
            0.5,
            -0.5,
            1.5,
            -2.5,
            0.49999997,
            -0.49999997,
            8388607.5,
            8388609.0,
        ];
        values.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            1e-45,
            f32::MAX,
        ]);
        values.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 0.013));
        for v in values {
            assert_eq!(round_half_away(v).to_bits(), v.round().to_bits(), "{v}");
        }
    }

    #[test]
    fn both_formats_give_candles_bits() -> candle_core::Result<()> {
        let values = rows();
        let tensor = Tensor::from_slice(&values, (values.len() / QK, QK), &Device::Cpu)?;
        for (format, dtype, bytes) in [
            (Format::Q8_0, GgmlDType::Q8_0, 34),
            (Format::Q8_1, GgmlDType::Q8_1, 36),
        ] {
            let ours = quantize(&values, format);
            let theirs = QTensor::quantize(&tensor, dtype)?.data()?.into_owned();
            for (b, block) in theirs.chunks_exact(bytes).enumerate() {
                let at = |i: usize| f16::from_le_bytes([block[i], block[i + 1]]).to_f32();
                let values: Vec<i8> = block[bytes - QK..]
                    .iter()
                    .map(|&v| i8::from_ne_bytes([v]))
                    .collect();
                assert_eq!(
                    &ours.values[b * QK..][..QK],
                    &values[..],
                    "{format:?} block {b}"
                );
                assert_eq!(
                    bits(&ours.scales[b..=b]),
                    bits(&[at(0)]),
                    "{format:?} d of {b}"
                );
                if format == Format::Q8_1 {
                    assert_eq!(bits(&ours.sums[b..=b]), bits(&[at(2)]), "s of block {b}");
                }
            }
        }
        Ok(())
    }
}
