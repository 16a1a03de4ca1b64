//! Sampling rows of every shape against the reference device: normal logits whose top-p sets
//! hold from one token to nearly the whole row (the sweep of σ below), at several temperatures,
//! top-p and top-k, from logits and from their probabilities, in f32 and the half dtypes, with
//! ties and masked (−inf, NaN) tokens. The rows are long enough for every path of the CPU's
//! sampling (the band and its bins, the sample that places it, the exact chunks of the draw),
//! and their kept sets cross every size those paths are cut at; every token must be the
//! reference device's.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

#[allow(dead_code)] // the helpers of the other test files
mod common;

use common::{down, up, zeros};
use specula_backend_api::fixed_point::{reaches_top_p, top_p_fixed};
use specula_backend_api::logit_weights::row_weights;
use specula_backend_api::ops::*;
use specula_backend_api::{Device, Element};
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;

/// A deterministic generator of test rows (64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }

    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// A row of `v` normal logits N(0, σ²); `style` 1 rounds them to eighths (long runs of ties),
/// style 2 masks one token in 50 (−inf) and puts a NaN in.
fn logits_row(g: &mut Lcg, v: usize, sigma: f64, style: usize) -> Vec<f32> {
    let mut row: Vec<f32> = (0..v).map(|_| (sigma * g.normal()) as f32).collect();
    match style {
        1 => row.iter_mut().for_each(|l| *l = (*l * 8.0).round() / 8.0),
        2 => {
            for i in (0..v).step_by(50) {
                row[i] = f32::NEG_INFINITY;
            }
            row[v / 2 + 1] = f32::NAN;
        }
        _ => {}
    }
    row
}

/// The softmax of a row at temperature `t` (f64, rounded to f32).
fn softmax(row: &[f32], t: f32) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = row
        .iter()
        .map(|&l| {
            if l.is_nan() {
                0.0
            } else {
                ((f64::from(l) - f64::from(max)) / f64::from(t)).exp()
            }
        })
        .collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| (x / sum) as f32).collect()
}

/// The size of a logits row's top-p set (no top-k).
fn kept_size(row: &[f32], t: f32, top_p: f32) -> usize {
    let mut w = row_weights(row, t);
    w.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = w.iter().sum();
    let (p, mut mass) = (top_p_fixed(top_p), 0u64);
    w.iter()
        .position(|&x| {
            mass += x;
            reaches_top_p(mass, p, total)
        })
        .map_or(w.len(), |n| n + 1)
}

/// The tokens `dev` samples from `rows` (`[n, v]`, logits at `temperature` when given).
fn sample<T: Element>(
    dev: &dyn Device,
    (rows, v): (&[T], usize),
    temperature: Option<&[f32]>,
    (top_k, top_p, seed): (&[i32], &[f32], &[u64]),
) -> Vec<i32> {
    let n = top_k.len();
    let scores = up(dev, rows);
    let t = temperature.map(|t| up(dev, t));
    let (top_k, top_p, seed) = (up(dev, top_k), up(dev, top_p), up(dev, seed));
    let scores = match &t {
        Some(t) => Scores::logits(&scores, t),
        None => Scores::Probs(&scores),
    };
    let mut tokens = zeros::<i32>(dev, n);
    let inputs = SampleInputs::new(scores, &top_k, &top_p, &seed);
    let params = SampleParams::new(RowShape { rows: n, vocab: v });
    dev.top_k_top_p_sample(&inputs, &mut tokens, &params)
        .expect("top_k_top_p_sample");
    down(dev, &tokens)
}

/// The settings every row is sampled in: `(top_k, top_p)`.
const SETTINGS: [(i32, f32); 8] = [
    (0, 1.0),
    (0, 0.999),
    (0, 0.99),
    (0, 0.9),
    (0, 0.5),
    (0, 0.1),
    (50, 0.9),
    (5000, 0.95),
];

/// The per-row parameters `(top_k, top_p, seed)` of one row per setting of [`SETTINGS`], row
/// `i`'s seed `seed(i)`.
fn setting_params(seed: impl FnMut(u64) -> u64) -> (Vec<i32>, Vec<f32>, Vec<u64>) {
    (
        SETTINGS.iter().map(|&(k, _)| k).collect(),
        SETTINGS.iter().map(|&(_, p)| p).collect(),
        (0..SETTINGS.len() as u64).map(seed).collect(),
    )
}

#[test]
fn rows_of_every_shape_agree_with_the_reference() {
    let cpu = CpuDevice::new().unwrap();
    let reference = ReferenceDevice::new();
    let mut g = Lcg(28);
    let sigmas = [9.0, 6.0, 5.1, 4.5, 3.8, 3.0, 2.8, 2.0, 1.2, 0.87, 0.3, 0.0];
    let mut sizes = Vec::new();
    for (case, &sigma) in sigmas.iter().enumerate() {
        let v = [151_936, 32_000, 9001, 4096, 4095, 65_536][case % 6];
        let style = case % 3;
        let t = [1.0f32, 0.8, 0.55, 1.7][case % 4];
        let row = logits_row(&mut g, v, sigma, style);
        sizes.push(kept_size(&row, t, 0.9));
        // One row per setting, each with its own seed.
        let n = SETTINGS.len();
        let rows: Vec<f32> = row.repeat(n);
        let (top_k, top_p, seed) = setting_params(|i| g.next() ^ i);
        let params = (&top_k[..], &top_p[..], &seed[..]);
        let temperature = vec![t; n];
        let from_logits = |dev: &dyn Device| sample(dev, (&rows, v), Some(&temperature), params);
        assert_eq!(
            from_logits(&cpu),
            from_logits(&reference),
            "logits, σ {sigma}, v {v}, style {style}, t {t}"
        );
        let probs: Vec<f32> = softmax(&row, t).repeat(n);
        let from_probs = |dev: &dyn Device| sample(dev, (&probs, v), None, params);
        assert_eq!(
            from_probs(&cpu),
            from_probs(&reference),
            "probabilities, σ {sigma}, v {v}, style {style}, t {t}"
        );
        if case % 4 == 1 {
            let half: Vec<half::bf16> = rows.iter().map(|&l| half::bf16::from_f32(l)).collect();
            let bf16 = |dev: &dyn Device| sample(dev, (&half, v), Some(&temperature), params);
            assert_eq!(
                bf16(&cpu),
                bf16(&reference),
                "bf16 logits, σ {sigma}, v {v}"
            );
        }
    }
    // The kept sets span one token to most of the row.
    assert!(sizes.iter().any(|&n| n <= 3), "{sizes:?}");
    assert!(
        sizes.iter().any(|&n| (1000..10_000).contains(&n)),
        "{sizes:?}"
    );
    assert!(sizes.iter().any(|&n| n >= 50_000), "{sizes:?}");
}

/// Many rows of one flat shape (the band's placement and the bounds' decisions vary from row to
/// row): every token is the reference device's.
#[test]
fn many_flat_rows_agree_with_the_reference() {
    let cpu = CpuDevice::new().unwrap();
    let reference = ReferenceDevice::new();
    let mut g = Lcg(2028);
    let (n, v) = (24, 32_000);
    for (sigma, t) in [(3.0, 1.0f32), (1.0, 1.0), (3.5, 0.8)] {
        let rows: Vec<f32> = (0..n)
            .flat_map(|_| logits_row(&mut g, v, sigma, 0))
            .collect();
        for top_p in [1.0f32, 0.9, 0.95] {
            let top_k = vec![0; n];
            let top_p = vec![top_p; n];
            let seed: Vec<u64> = (0..n).map(|_| g.next()).collect();
            let temperature = vec![t; n];
            let params = (&top_k[..], &top_p[..], &seed[..]);
            let run = |dev: &dyn Device| sample(dev, (&rows, v), Some(&temperature), params);
            assert_eq!(
                run(&cpu),
                run(&reference),
                "σ {sigma}, t {t}, top_p {}",
                top_p[0]
            );
        }
    }
}

/// Long rows whose logits read alike (flushed to +0 or clamped to `±2^64`, so that they weigh
/// alike) rank by the logit itself (`docs/semantics.md` §4b step 1): every setting gives the
/// reference device's token, in f32 and bf16.
#[test]
fn rows_of_logits_that_read_alike_agree_with_the_reference() {
    let cpu = CpuDevice::new().unwrap();
    let reference = ReferenceDevice::new();
    let mut g = Lcg(2029);
    let v = 9001;
    let tiny: Vec<f32> = (0..v)
        .map(|i| match i % 5 {
            0 => 0.0,
            1 => -0.0,
            _ => (g.normal() * 1e-30) as f32,
        })
        .collect();
    let huge: Vec<f32> = (0..v)
        .map(|i| {
            let l = g.normal() as f32;
            if i % 9 == 0 {
                l.signum() * 3e38 * l.abs().min(1.0) + 2e19
            } else {
                l
            }
        })
        .collect();
    let low: Vec<f32> = (0..v)
        .map(|i| match i % 13 {
            0 => f32::NEG_INFINITY,
            1 => f32::NAN,
            _ => -(2e19 + 1e38 * g.unit() as f32),
        })
        .collect();
    for (name, row) in [("tiny", tiny), ("huge", huge), ("low", low)] {
        let n = SETTINGS.len();
        let rows: Vec<f32> = row.repeat(n);
        let (top_k, top_p, seed) = setting_params(|_| g.next());
        let params = (&top_k[..], &top_p[..], &seed[..]);
        for t in [1.0f32, 0.6, 0.0] {
            let temperature = vec![t; n];
            let f32s = |dev: &dyn Device| sample(dev, (&rows, v), Some(&temperature), params);
            assert_eq!(f32s(&cpu), f32s(&reference), "{name}, t {t}");
            let half: Vec<half::bf16> = rows.iter().map(|&l| half::bf16::from_f32(l)).collect();
            let bf16 = |dev: &dyn Device| sample(dev, (&half, v), Some(&temperature), params);
            assert_eq!(bf16(&cpu), bf16(&reference), "bf16 {name}, t {t}");
        }
    }
}

/// Rows that mislead the strided sample the CPU places its band from (runs of 32 tokens, 128 of
/// them spread evenly over the row), so that its band misses the threshold and is widened:
/// sampled runs of near-zero weights with one token at logit 6 each over a normal bulk (the
/// threshold lies below the band), sampled runs at logit 3 with heavy tokens (logit 8) between
/// them (the threshold lies above it); and a normal row rounded to eighths, whose long runs of
/// ties straddle the band's edges. Every token is the reference device's, from logits and from
/// probabilities.
#[test]
fn rows_that_mislead_the_band_sample_agree_with_the_reference() {
    let cpu = CpuDevice::new().unwrap();
    let reference = ReferenceDevice::new();
    let mut g = Lcg(2030);
    let v = 151_936;
    let (runs, run) = (128, 32);
    let step = v / runs;
    let bulk = logits_row(&mut g, v, 1.0, 0);
    let below: Vec<f32> = (0..v)
        .map(|i| match (i, i % step) {
            (1, _) => 4.0,
            (_, 0) => 6.0,
            (_, j) if j < run => -30.0,
            _ => bulk[i],
        })
        .collect();
    let mut above: Vec<f32> = (0..v)
        .map(|i| if i % step < run { 3.0 } else { -30.0 })
        .collect();
    for r in 0..runs {
        above[r * step + run + 7] = 8.0 + 0.125 * (r % 3) as f32;
        above[r * step + run + 300] = 8.0;
    }
    let ties = logits_row(&mut g, v, 2.0, 1);
    for (name, row) in [("below", below), ("above", above), ("ties", ties)] {
        let n = SETTINGS.len();
        let rows: Vec<f32> = row.repeat(n);
        let (top_k, top_p, seed) = setting_params(|_| g.next());
        let params = (&top_k[..], &top_p[..], &seed[..]);
        let temperature = vec![1.0f32; n];
        let from_logits = |dev: &dyn Device| sample(dev, (&rows, v), Some(&temperature), params);
        assert_eq!(from_logits(&cpu), from_logits(&reference), "logits, {name}");
        let probs: Vec<f32> = softmax(&row, 1.0).repeat(n);
        let from_probs = |dev: &dyn Device| sample(dev, (&probs, v), None, params);
        assert_eq!(
            from_probs(&cpu),
            from_probs(&reference),
            "probabilities, {name}"
        );
    }
}

/// Asserts that the CPU device samples `rows` (logits at `temperature`) as the reference does.
fn assert_as_reference<T: Element>(
    rows: (&[T], usize),
    temperature: &[f32],
    params: (&[i32], &[f32], &[u64]),
    what: &str,
) {
    let (cpu, reference) = (CpuDevice::new().unwrap(), ReferenceDevice::new());
    let run = |dev: &dyn Device| sample(dev, rows, Some(temperature), params);
    assert_eq!(run(&cpu), run(&reference), "{what}");
}

/// Rows whose mass is spread over many tokens (σ 0.874 at T 1 and σ 0.0437 at T 0.05: kept sets
/// of ~100k), on which the CPU places its band before the first pass and narrows it at three
/// logit levels inside it: plain, rounded to eighths (long runs of ties wherever the levels and
/// the threshold fall; at σ 0.0437 nearly every token ties at 0), and with −inf and a NaN. Every
/// token is the reference device's, in f32 and bf16.
#[test]
fn rows_whose_band_the_first_pass_narrows_agree_with_the_reference() {
    let (mut g, v) = (Lcg(2031), 65_536);
    // (σ, T, style, also as bf16)
    let rows = [
        (0.874, 1.0f32, 0, true),
        (0.874, 1.0, 1, false),
        (0.874, 1.0, 2, false),
        (0.0437, 0.05, 1, false),
        (0.0437, 0.05, 2, true),
    ];
    // The settings without top-k (those that take the band path).
    let top_p = [0.999f32, 0.99, 0.9, 0.5, 0.1];
    let (n, top_k) = (top_p.len(), [0; 5]);
    for (sigma, t, style, bf16) in rows {
        let rows: Vec<f32> = logits_row(&mut g, v, sigma, style).repeat(n);
        let seed: Vec<u64> = (0..n).map(|_| g.next()).collect();
        let params = (&top_k[..], &top_p[..], &seed[..]);
        let temperature = vec![t; n];
        assert_as_reference(
            (&rows, v),
            &temperature,
            params,
            &format!("σ {sigma}, {style}"),
        );
        if bf16 {
            let half: Vec<half::bf16> = rows.iter().map(|&l| half::bf16::from_f32(l)).collect();
            let what = format!("bf16 σ {sigma}, style {style}");
            assert_as_reference((&half, v), &temperature, params, &what);
        }
    }
}

/// Probability rows whose top-p set (no top-k) is wider than the fast path's candidates: flat
/// rows and kept sets of ~10k and ~100k tokens, on which the CPU places its band from a sample
/// before any pass (the total assumed 1) and decides in one pass; the same rows with long runs
/// of ties, with NaN, negative and zero entries, and scaled to sum to 0.5 and 2 (the band placed
/// for 1 misses: the two-pass path decides). Every token is the reference device's, in f32, f16
/// and bf16.
#[test]
fn wide_probability_rows_decided_in_one_pass_agree_with_the_reference() {
    let (cpu, reference) = (CpuDevice::new().unwrap(), ReferenceDevice::new());
    let (mut g, v) = (Lcg(2032), 151_936);
    let top_p = [0.999f32, 0.99, 0.9, 0.5, 0.1];
    let (n, top_k) = (top_p.len(), [0; 5]);
    // σ of the logits, style of the row, what its probabilities sum to; the half dtypes too
    // on the flat and the hostile rows.
    let sigmas = [3.0, 2.79, 0.874, 2.79, 0.874];
    let styles_and_sums = [(0, 1.0f32), (1, 1.0), (2, 1.0), (0, 0.5), (0, 2.0)];
    for (i, (sigma, (style, scale))) in sigmas.into_iter().zip(styles_and_sums).enumerate() {
        let halves = i == 0 || i == 2;
        let probs: Vec<f32> = softmax(&logits_row(&mut g, v, sigma, style), 1.0)
            .iter()
            .map(|p| p * scale)
            .collect();
        let mut probs = probs.repeat(n);
        if style == 2 {
            probs[3] = -0.25;
            probs[v + 9] = f32::NAN;
        }
        let seed: Vec<u64> = (0..n).map(|_| g.next()).collect();
        let params = (&top_k[..], &top_p[..], &seed[..]);
        let what = format!("σ {sigma}, style {style}, sum {scale}");
        let run = |dev: &dyn Device| sample(dev, (&probs, v), None, params);
        assert_eq!(run(&cpu), run(&reference), "{what}");
        if halves {
            let f16: Vec<half::f16> = probs.iter().map(|&p| half::f16::from_f32(p)).collect();
            let run = |dev: &dyn Device| sample(dev, (&f16, v), None, params);
            assert_eq!(run(&cpu), run(&reference), "f16 {what}");
            let bf16: Vec<half::bf16> = probs.iter().map(|&p| half::bf16::from_f32(p)).collect();
            let run = |dev: &dyn Device| sample(dev, (&bf16, v), None, params);
            assert_eq!(run(&cpu), run(&reference), "bf16 {what}");
        }
    }
}
