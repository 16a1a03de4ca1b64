//! Float precision, on the reference and on the CPU: `softmax` probabilities and `accept_logprobs`
//! log-probabilities in f32 against f64 definitions of the same rules, for f32 and exactly widened
//! f16 / bf16 inputs. Both devices are held here to about 1e-6 relative per unit of |ln p| — far
//! tighter than the conformance suite's tolerance between backends (`conformance::compare`: at
//! least 1e-4), which holds every backend to the reference but not the reference to the truth.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{devices, logprobs, name, softmax};
use half::{bf16, f16};
use specula_backend_api::{Device, Element};

/// A deterministic pseudo-random f32 in [-1, 1) (a 64-bit LCG).
fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// softmax((x − m) / t) in f64, NaN as −inf (rows with a finite maximum).
fn softmax_f64(row: &[f32], t: f32) -> Vec<f64> {
    let x: Vec<f64> = row
        .iter()
        .map(|&x| {
            if x.is_nan() {
                f64::NEG_INFINITY
            } else {
                f64::from(x)
            }
        })
        .collect();
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let y: Vec<f64> = x.iter().map(|v| (v - m) / f64::from(t)).collect();
    let sum: f64 = y.iter().map(|v| v.exp()).sum();
    y.iter().map(|v| v.exp() / sum).collect()
}

/// `softmax` of `logits` (whose values are `widened`) on `dev` is within rounding of f64.
fn assert_softmax_close<T: Element>(
    dev: &dyn Device,
    (logits, widened): (&[T], &[f32]),
    vocab: usize,
    temperature: &[f32],
) {
    let probs = softmax(dev, logits, vocab, temperature);
    for (r, &t) in temperature.iter().enumerate() {
        let range = r * vocab..(r + 1) * vocab;
        let want = softmax_f64(&widened[range.clone()], t);
        for (i, (&g, &w)) in probs[range].iter().zip(&want).enumerate() {
            let at = format!("{} {}: row {r} entry {i}: {g} vs {w}", name(dev), T::DTYPE);
            if w < 1e-30 {
                // Dominated by subnormal rounding: compared absolutely.
                assert!(f64::from(g).abs() < 1e-30, "{at}");
            } else {
                // exp(y) carries the f32 rounding of y = (x − m) / t, about |y| ulps: |ln w|.
                let err = (f64::from(g) - w).abs();
                assert!(err <= 1e-6 * (1.0 + w.ln().abs()) * w, "{at}");
            }
        }
    }
}

#[test]
fn softmax_is_within_rounding_of_f64() {
    let vocab = 1003;
    let temperature = [0.7f32, 1.0, 2.0, 1e-3];
    let mut state = 7;
    // Logits in [-3, 3]; at T = 1e-3 the row is very peaked (many entries underflow to 0).
    let rows: Vec<f32> = (0..vocab * temperature.len())
        .map(|_| 3.0 * lcg(&mut state))
        .collect();
    let half: Vec<f16> = rows.iter().map(|&x| f16::from_f32(x)).collect();
    let half_values: Vec<f32> = half.iter().map(|x| x.to_f32()).collect();
    let brain: Vec<bf16> = rows.iter().map(|&x| bf16::from_f32(x)).collect();
    let brain_values: Vec<f32> = brain.iter().map(|x| x.to_f32()).collect();
    for dev in devices() {
        let dev = dev.as_ref();
        assert_softmax_close(dev, (&rows, &rows), vocab, &temperature);
        assert_softmax_close(dev, (&half, &half_values), vocab, &temperature);
        assert_softmax_close(dev, (&brain, &brain_values), vocab, &temperature);
    }
}

#[test]
fn logprobs_are_within_rounding_of_f64() {
    let vocab = 2001;
    let mut state = 3;
    let rows: Vec<f32> = (0..3 * vocab).map(|_| 4.0 * lcg(&mut state)).collect();
    let temperature = [1.0f32, 0.5, 3.0];
    let tokens = [0, 100, 200];
    let k = 64;
    let close = |got: f32, want: f64| (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0);
    for dev in devices() {
        let dev = dev.as_ref();
        let out = logprobs(dev, &rows, vocab, &temperature, &tokens, k);
        for (r, &t) in temperature.iter().enumerate() {
            let row = &rows[r * vocab..(r + 1) * vocab];
            let ln: Vec<f64> = softmax_f64(row, t).iter().map(|p| p.ln()).collect();
            let (got, want) = (out.logprobs[r], ln[tokens[r] as usize]);
            assert!(close(got, want), "{}: row {r}: {got} vs {want}", name(dev));
            for j in r * k..(r + 1) * k {
                let (got, want) = (out.top_logprobs[j], ln[out.top_ids[j] as usize]);
                assert!(close(got, want), "{}: top {j}: {got} vs {want}", name(dev));
            }
        }
    }
}
