//! What the CPU device itself decides, beyond the ops' results (which the conformance suite holds
//! to the reference device on every case): the dtypes it declares, and its thread count.
//!
//! The thread count sets how many threads scan one row of `top_k_top_p_sample` and
//! `top_p_candidates`: the pool's threads shared among the rows, a row being split only from
//! 64 blocks of 256 tokens. The suite runs the CPU at the machine's thread count; here 1 to 8
//! threads run batches of 1 to 5 rows long enough to be split, in every float dtype, and must give
//! the reference device's tokens and candidates.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{Rows, sample_and_candidates};
use half::{bf16, f16};
use specula_backend_api::{DType, Device, Element};
use specula_backend_cpu::CpuDevice;
use specula_reference::ReferenceDevice;

/// The CPU backend is the one that runs everywhere: it takes every float dtype, and no buffer is
/// too large for it to try.
#[test]
fn the_cpu_declares_every_float_dtype() {
    let cpu = CpuDevice::with_threads(1).unwrap();
    assert_eq!(cpu.capabilities().float_dtypes, DType::FLOATS);
    assert_eq!(cpu.capabilities().max_buffer_bytes, None);
}

/// The next state of a 64-bit LCG (test data, not the sampling RNG).
fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state
}

/// A deterministic pseudo-random value in [0, 1).
fn unit(state: &mut u64) -> f32 {
    (next(state) >> 40) as f32 / (1u64 << 24) as f32
}

/// A row of `vocab` probabilities in one of four styles: peaked (the fast path decides), runs of
/// ties, flat (top-p may leave it to the histogram path), hostile values.
fn row(state: &mut u64, vocab: usize, style: usize) -> Vec<f32> {
    let (scale, style) = (1.0 / vocab as f32, style % 4);
    let mut row: Vec<f32> = (0..vocab)
        .map(|i| {
            let u = unit(state);
            match style {
                0 => u * u * u * 3.0 * scale,
                1 => (u * 4.0).floor() * 0.5 * scale,
                2 => (1.0 + 0.01 * u) * scale,
                _ => [f32::NAN, -u, 0.0, f32::INFINITY, 1.5, u * scale][i % 6],
            }
        })
        .collect();
    if style == 0 {
        for peak in [7, vocab / 3, vocab - 1] {
            row[peak] = 0.2 * unit(state);
        }
    }
    row
}

/// `rows` rows of 40 000 tokens (625 blocks: split among up to 8 threads), every style, top-k up to
/// beyond the fast path's 2048, top-p from 0.5 to 1.
fn rows(rows: usize, state: &mut u64) -> Rows<f32> {
    let vocab = 40_000;
    let pick = |state: &mut u64, n: usize| (unit(state) * n as f32) as usize;
    let probs = (0..rows)
        .flat_map(|r| {
            let style = r + pick(state, 4);
            row(state, vocab, style)
        })
        .collect();
    let top_k = (0..rows)
        .map(|_| [0, 1, 50, 3000][pick(state, 4)])
        .collect();
    let top_p = (0..rows).map(|_| [1.0, 0.9, 0.5][pick(state, 3)]).collect();
    let seed = (0..rows).map(|_| next(state)).collect();
    Rows {
        probs,
        vocab,
        top_k,
        top_p,
        seed,
    }
}

/// The same rows in another float type.
fn convert<T>(rows: &Rows<f32>, to: impl Fn(f32) -> T) -> Rows<T> {
    Rows {
        probs: rows.probs.iter().map(|&p| to(p)).collect(),
        vocab: rows.vocab,
        top_k: rows.top_k.clone(),
        top_p: rows.top_p.clone(),
        seed: rows.seed.clone(),
    }
}

/// Every CPU in `cpus` gives the reference's outputs on `rows`.
fn assert_agree<T: Element>(cpus: &[CpuDevice], rows: &Rows<T>) {
    let expected = sample_and_candidates(&ReferenceDevice::new(), rows);
    for cpu in cpus {
        let got = sample_and_candidates(cpu, rows);
        let label = format!(
            "{}, {} rows of {}",
            cpu.info().name,
            rows.top_k.len(),
            T::DTYPE
        );
        assert_eq!(got.0, expected.0, "tokens: {label}");
        assert_eq!(
            (&got.1, &got.3),
            (&expected.1, &expected.3),
            "candidates: {label}"
        );
        assert_eq!(got.2, expected.2, "scores: {label}");
    }
}

#[test]
fn every_thread_count_gives_the_reference_results() {
    let cpus: Vec<CpuDevice> = [1, 2, 3, 8]
        .into_iter()
        .map(|threads| CpuDevice::with_threads(threads).unwrap())
        .collect();
    let mut state = 17;
    for n in [1, 1, 1, 2, 3, 5] {
        let batch = rows(n, &mut state);
        assert_agree(&cpus, &batch);
        assert_agree(&cpus, &convert(&batch, f16::from_f32));
        assert_agree(&cpus, &convert(&batch, bf16::from_f32));
    }
}
