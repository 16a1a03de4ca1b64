//! Inputs larger than the adapter's largest storage binding are processed in row chunks, not
//! rejected: 384 rows × 151936 f32 probabilities (233 MB, above lavapipe's 128 MiB binding limit)
//! sampled and argmaxed on wgpu, compared with the CPU reference.
//!
//! Slow on a software adapter (about a minute on lavapipe), so it is ignored by default:
//! `cargo test -p specula-backend-wgpu --test large_inputs -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use specula_backend_api::ops::{RowShape, SampleInputs, SampleParams};
use specula_backend_api::{Device, DeviceExt, Error};

fn probabilities(rows: usize, vocab: usize) -> Vec<f32> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::with_capacity(rows * vocab);
    for _ in 0..rows * vocab {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = (x >> 40) as f32 / (1u64 << 24) as f32;
        // Heavy-tailed, with ties, like real next-token distributions.
        out.push((u * u * u * u * 64.0).floor() / 4096.0);
    }
    out
}

#[test]
#[ignore = "233 MB on a software adapter: run with --ignored"]
fn rows_beyond_the_largest_binding_are_chunked() {
    let wgpu = match specula_backend_wgpu::open(0) {
        Ok(device) => device,
        Err(Error::Unavailable { reason, .. }) => {
            eprintln!("skipped: wgpu unavailable: {reason}");
            return;
        }
        Err(other) => panic!("{other}"),
    };
    let cpu = specula_backend_cpu::CpuDevice::new().unwrap();
    let (rows, vocab) = (384, 151_936);
    let probs = probabilities(rows, vocab);
    assert!(
        (probs.len() * 4) as u64
            > wgpu
                .capabilities()
                .max_buffer_bytes
                .unwrap_or(u64::MAX)
                .min(128 << 20),
        "the input must exceed the binding limit"
    );
    let top_k: Vec<i32> = (0..rows as i32)
        .map(|r| [0, 1, 50, 1000][r as usize % 4])
        .collect();
    let top_p: Vec<f32> = (0..rows).map(|r| [1.0, 0.9, 0.5][r % 3]).collect();
    let seed: Vec<u64> = (0..rows as u64).map(|r| r * 0x1234_5678_9abc + 7).collect();
    let shape = RowShape { rows, vocab };
    let mut results = Vec::new();
    for device in [&cpu as &dyn Device, wgpu.as_ref()] {
        let p = device.upload(&probs).unwrap();
        let (k, tp, s) = (
            device.upload(&top_k).unwrap(),
            device.upload(&top_p).unwrap(),
            device.upload(&seed).unwrap(),
        );
        let mut tokens = device.alloc::<i32>(rows).unwrap();
        let mut argmax = device.alloc::<i32>(rows).unwrap();
        let start = std::time::Instant::now();
        device
            .top_k_top_p_sample(
                &SampleInputs {
                    probs: &p,
                    top_k: &k,
                    top_p: &tp,
                    seed: &s,
                },
                &mut tokens,
                &SampleParams {
                    shape,
                    host_top_p: None,
                },
            )
            .unwrap();
        device.argmax(&p, &mut argmax, &shape).unwrap();
        device.synchronize().unwrap();
        eprintln!("{}: {:?}", device.info().name, start.elapsed());
        results.push((
            device.download::<i32>(&tokens).unwrap(),
            device.download::<i32>(&argmax).unwrap(),
        ));
    }
    assert_eq!(results[0].1, results[1].1, "argmax");
    assert_eq!(results[0].0, results[1].0, "top_k_top_p_sample");
}
