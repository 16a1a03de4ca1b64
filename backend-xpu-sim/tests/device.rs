//! Smoke tests on the first OpenCL device, when there is one (the conformance suite is the real
//! check): launch shapes do not change exact results, and bad launches are refused.
#![allow(clippy::unwrap_used)]

use specula_backend_api::ops::{RowShape, SampleInputs, SampleParams};
use specula_backend_api::{Device, DeviceExt, Error};
use specula_backend_xpu_sim::{LaunchConfig, XpuSimDevice};

fn device(launch: LaunchConfig) -> Option<XpuSimDevice> {
    match XpuSimDevice::with_launch(0, launch) {
        Ok(device) => Some(device),
        Err(Error::Unavailable { reason, .. }) => {
            eprintln!("skipped: xpu-sim unavailable: {reason}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn sample(device: &dyn Device, probs: &[f32], vocab: usize) -> Vec<i32> {
    let rows = probs.len() / vocab;
    let probs = device.upload(probs).unwrap();
    let top_k: Vec<i32> = (0..rows as i32).map(|r| r % 5).collect();
    let top_p: Vec<f32> = (0..rows).map(|r| 0.5 + 0.1 * (r % 5) as f32).collect();
    let seed: Vec<u64> = (0..rows as u64).map(|r| r * 0x9E37_79B9 + 7).collect();
    let (top_k, top_p, seed) = (
        device.upload(&top_k).unwrap(),
        device.upload(&top_p).unwrap(),
        device.upload(&seed).unwrap(),
    );
    let mut tokens = device.alloc::<i32>(rows).unwrap();
    device
        .top_k_top_p_sample(
            &SampleInputs {
                probs: &probs,
                top_k: &top_k,
                top_p: &top_p,
                seed: &seed,
            },
            &mut tokens,
            &SampleParams {
                shape: RowShape { rows, vocab },
                host_top_p: None,
            },
        )
        .unwrap();
    device.download(&tokens).unwrap()
}

#[test]
fn launch_shapes_agree_with_the_cpu() {
    let vocab = 1031;
    let mut x = 12345u64;
    let probs: Vec<f32> = (0..7 * vocab)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32).powi(3) / 100.0
        })
        .collect();
    let cpu = specula_backend_cpu::CpuDevice::new().unwrap();
    let expected = sample(&cpu, &probs, vocab);
    for launch in [
        LaunchConfig::default(),
        LaunchConfig::new(2, 16),
        LaunchConfig::new(3, 5),
    ] {
        let Some(device) = device(launch) else { return };
        assert_eq!(device.launch_config(), launch);
        assert_eq!(sample(&device, &probs, vocab), expected, "launch {launch}");
    }
}

#[test]
fn out_of_range_launches_are_unavailable() {
    if device(LaunchConfig::new(1, 1)).is_none() {
        return;
    }
    for launch in [LaunchConfig::new(0, 8), LaunchConfig::new(2, 100_000)] {
        assert!(matches!(
            XpuSimDevice::with_launch(0, launch),
            Err(Error::Unavailable { .. })
        ));
    }
    assert!(matches!(
        XpuSimDevice::with_launch(10_000, LaunchConfig::default()),
        Err(Error::Unavailable { .. })
    ));
}
