//! Criterion benchmarks of the CPU backend's hot ops at 64 × 151936 f32 and at batch 1, each next
//! to a plain streaming read of the same buffer (`read_floor`), so the ratios can be read off one
//! run. `specula bench` gives the full table with ratios; these are for regression tracking.

#![allow(clippy::unwrap_used)] // benchmark set-up

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use specula_backend_api::ops::*;
use specula_backend_api::{Device, DeviceExt};
use specula_backend_cpu::CpuDevice;

/// LLM-like rows: softmax of Gaussian logits (σ = 3.5), as in `specula bench`.
fn rows(n: usize, vocab: usize) -> Vec<f32> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut unit = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(n * vocab);
    for _ in 0..n {
        let logits: Vec<f64> = (0..vocab)
            .map(|_| {
                let (u, v) = (unit(), unit());
                3.5 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
            })
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
        out.extend(logits.iter().map(|l| ((l - max).exp() / sum) as f32));
    }
    out
}

fn bench(c: &mut Criterion) {
    let cpu = CpuDevice::new().unwrap();
    let vocab = 151_936;
    for batch in [1usize, 64] {
        let probs = cpu.upload(&rows(batch, vocab)).unwrap();
        let seed = cpu.upload(&(0..batch as u64).collect::<Vec<_>>()).unwrap();
        let mut tokens = cpu.alloc::<i32>(batch).unwrap();
        let shape = RowShape { rows: batch, vocab };
        let mut group = c.benchmark_group(format!("cpu/{batch}x{vocab}"));
        group.throughput(Throughput::Bytes((batch * vocab * 4) as u64));
        group.bench_function("floor_read", |b| b.iter(|| cpu.read_floor(&probs).unwrap()));
        for (k, p) in [(0, 0.9f32), (50, 0.9), (0, 1.0)] {
            let (top_k, top_p) = (
                cpu.upload(&vec![k; batch]).unwrap(),
                cpu.upload(&vec![p; batch]).unwrap(),
            );
            let inputs = SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed);
            let params = SampleParams::new(shape);
            group.bench_function(format!("top_k_top_p_sample_k{k}_p{p}"), |b| {
                b.iter(|| {
                    cpu.top_k_top_p_sample(&inputs, &mut tokens, &params)
                        .unwrap()
                })
            });
        }
        group.bench_function("argmax", |b| {
            b.iter(|| cpu.argmax(&probs, &mut tokens, &shape).unwrap())
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
