//! One-row logits calls on the caller's thread (`parallel`) against the reference device and
//! the pool's path.

use specula_backend_api::ops::{RowShape, SampleInputs, SampleParams, Scores};
use specula_backend_api::{DType, Device, DeviceExt, Element};
use specula_reference::ReferenceDevice;

use crate::CpuDevice;
use crate::sampling::lcg::Lcg;

/// Normal logits N(0, σ²) (Box–Muller).
pub(super) fn normal_row(lcg: &mut Lcg, v: usize, sigma: f32) -> Vec<f32> {
    let mut normal = || {
        let radius = (-2.0 * lcg.unit().max(1e-7).ln()).sqrt();
        radius * (std::f32::consts::TAU * lcg.unit()).cos()
    };
    (0..v).map(|_| sigma * normal()).collect()
}

/// The token `dev` samples from one row of logits at `t`.
fn sample<T: Element>(dev: &dyn Device, row: &[T], t: f32, (k, p, seed): (i32, f32, u64)) -> i32 {
    let logits = dev.upload(row).expect("upload");
    let temperature = dev.upload(&[t]).expect("upload");
    let (top_k, top_p) = (
        dev.upload(&[k]).expect("upload"),
        dev.upload(&[p]).expect("upload"),
    );
    let seed = dev.upload(&[seed]).expect("upload");
    let mut token = dev.alloc::<i32>(1).expect("alloc");
    let inputs = SampleInputs::new(Scores::logits(&logits, &temperature), &top_k, &top_p, &seed);
    let params = SampleParams::new(RowShape {
        rows: 1,
        vocab: row.len(),
    });
    dev.top_k_top_p_sample(&inputs, &mut token, &params)
        .expect("top_k_top_p_sample");
    dev.download::<i32>(&token).expect("download")[0]
}

/// The settings of the test: the caller's thread takes top-k (any split) and top-p 1 (split in
/// two or not split); top-k 0 / top-p 0.9 stays on the pool.
const SETTINGS: [(i32, f32); 5] = [(0, 1.0), (50, 0.9), (50, 1.0), (39_999, 1.0), (0, 0.9)];

/// One row per call, on devices of one, two and three threads (the row not split, split in two
/// with a worker's help, split in three on the pool): flat and spread rows, halves far apart, a
/// NaN half and −inf tokens, in f32 and bf16 — every token is the reference device's.
#[test]
fn one_row_on_the_callers_thread_samples_as_the_reference() {
    let mut lcg = Lcg(41);
    let v = 40_000;
    let mut rows = vec![normal_row(&mut lcg, v, 3.0), normal_row(&mut lcg, v, 0.874)];
    let mut far = normal_row(&mut lcg, v, 1.0);
    far[v / 2..].iter_mut().for_each(|l| *l -= 45.0);
    rows.push(far);
    let mut masked = normal_row(&mut lcg, v, 2.0);
    masked[..v / 2 + 300].fill(f32::NAN);
    masked[v - 900..].fill(f32::NEG_INFINITY);
    rows.push(masked);
    let reference = ReferenceDevice::new();
    let devices: Vec<CpuDevice> = [1, 2, 3]
        .iter()
        .map(|&n| CpuDevice::with_threads(n).expect("cpu"))
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let half: Vec<half::bf16> = row.iter().map(|&l| half::bf16::from_f32(l)).collect();
        for (s, &(k, p)) in SETTINGS.iter().enumerate() {
            for seed in [1, 7, 1 << 40] {
                let what = |d: &CpuDevice, dtype: DType| {
                    format!(
                        "row {i}, setting {s}, seed {seed}, {} threads, {dtype:?}",
                        d.threads()
                    )
                };
                let sampling = (k, p, seed + s as u64);
                let (want, want_half) = (
                    sample(&reference, row, 0.9, sampling),
                    sample(&reference, &half, 0.9, sampling),
                );
                for cpu in &devices {
                    assert_eq!(
                        sample(cpu, row, 0.9, sampling),
                        want,
                        "{}",
                        what(cpu, DType::F32)
                    );
                    let got = sample(cpu, &half, 0.9, sampling);
                    assert_eq!(got, want_half, "{}", what(cpu, DType::BF16));
                }
            }
        }
    }
}

/// A call made from inside another call's work (a worker of the device's own pool) is not run
/// as a caller's call (its worker would wait on work queued behind itself): it still samples.
#[test]
fn a_call_from_a_worker_of_the_pool_still_samples() {
    let cpu = CpuDevice::with_threads(2).expect("cpu");
    let mut lcg = Lcg(43);
    let row = normal_row(&mut lcg, 40_000, 3.0);
    let want = sample(&ReferenceDevice::new(), &row, 1.0, (0, 1.0, 9));
    let got = cpu.install(|| {
        assert!(cpu.is_worker());
        sample(&cpu, &row, 1.0, (0, 1.0, 9))
    });
    assert_eq!(got, want);
}
