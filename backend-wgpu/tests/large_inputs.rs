//! Inputs larger than the adapter's largest storage binding are processed in row chunks, not
//! rejected: 384 rows × 151936 f32 probabilities (233 MB, above lavapipe's 128 MiB binding limit)
//! sampled and argmaxed on wgpu, compared with the CPU reference.
//!
//! Without a usable adapter the test is listed as ignored with the reason, and fails under
//! `SPECULA_REQUIRE=wgpu` (`specula_backend_api::testing`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use specula_backend_api::ops::{RowShape, SampleInputs, SampleParams, Scores};
use specula_backend_api::{Device, DeviceExt};

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

/// The sampled tokens and the argmax of every row, as `device` computes them.
fn sample_and_argmax(
    device: &dyn Device,
    probs: &[f32],
    shape: RowShape,
) -> specula_backend_api::Result<(Vec<i32>, Vec<i32>)> {
    let rows = shape.rows;
    let top_k: Vec<i32> = (0..rows).map(|r| [0, 1, 50, 1000][r % 4]).collect();
    let top_p: Vec<f32> = (0..rows).map(|r| [1.0, 0.9, 0.5][r % 3]).collect();
    let seed: Vec<u64> = (0..rows as u64).map(|r| r * 0x1234_5678_9abc + 7).collect();
    let p = device.upload(probs)?;
    let (k, tp, s) = (
        device.upload(&top_k)?,
        device.upload(&top_p)?,
        device.upload(&seed)?,
    );
    let mut tokens = device.alloc::<i32>(rows)?;
    let mut argmax = device.alloc::<i32>(rows)?;
    let start = std::time::Instant::now();
    device.top_k_top_p_sample(
        &SampleInputs::new(Scores::Probs(&p), &k, &tp, &s),
        &mut tokens,
        &SampleParams::new(shape),
    )?;
    device.argmax(&p, &mut argmax, &shape)?;
    device.synchronize()?;
    eprintln!("{}: {:?}", device.info().name, start.elapsed());
    Ok((device.download(&tokens)?, device.download(&argmax)?))
}

fn rows_beyond_the_largest_binding_are_chunked(wgpu: Arc<dyn Device>) -> Result<(), String> {
    let cpu = specula_backend_cpu::CpuDevice::new().map_err(|e| e.to_string())?;
    let (rows, vocab) = (384, 151_936);
    let probs = probabilities(rows, vocab);
    let limit = wgpu
        .capabilities()
        .max_buffer_bytes
        .unwrap_or(u64::MAX)
        .min(128 << 20);
    if (probs.len() * 4) as u64 <= limit {
        return Err(format!(
            "the input must exceed the binding limit ({limit} bytes)"
        ));
    }
    let shape = RowShape { rows, vocab };
    let expected = sample_and_argmax(&cpu, &probs, shape).map_err(|e| e.to_string())?;
    let actual = sample_and_argmax(wgpu.as_ref(), &probs, shape).map_err(|e| e.to_string())?;
    if actual.1 != expected.1 {
        return Err("argmax differs from the CPU".to_owned());
    }
    if actual.0 != expected.0 {
        return Err("top_k_top_p_sample differs from the CPU".to_owned());
    }
    Ok(())
}

fn main() -> ExitCode {
    common::run_on_wgpu(
        "rows_beyond_the_largest_binding_are_chunked",
        rows_beyond_the_largest_binding_are_chunked,
    )
}
