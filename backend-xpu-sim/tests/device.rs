//! Tests on the first OpenCL device (the conformance suite is the real check): launch shapes do not
//! change exact results, bad launches are refused, an op the front never skips still runs its
//! kernels on a batch without rows, tiny temperatures do not overflow the log-probabilities, and
//! the warm-up builds every program once. Without an OpenCL device every test is reported as
//! ignored with the reason, and fails under `SPECULA_REQUIRE=xpu-sim`.

mod common;

use common::open;

use std::process::ExitCode;

use specula_backend_api::named_tests;
use specula_backend_api::ops::{
    BatchDims, LogprobsBuffers, LogprobsInputs, LogprobsParams, RowShape, SampleInputs,
    SampleParams, Scores,
};
use specula_backend_api::testing::{self, TestFn};
use specula_backend_api::{Device, DeviceExt, Error};
use specula_backend_xpu_sim::{LaunchConfig, XpuSimDevice};

type TestResult = Result<(), String>;

fn main() -> ExitCode {
    let tests: Vec<(&str, TestFn)> = named_tests![
        launch_shapes_agree_with_the_cpu,
        out_of_range_launches_are_unavailable,
        accept_logprobs_packs_a_batch_without_rows,
        tiny_temperature_logprobs_tend_to_the_one_hot,
        warm_up_builds_every_program_once,
    ];
    common::run_all_on_xpu_sim(tests)
}

/// The error of a device call, as a test failure.
fn fail(context: &str) -> impl Fn(Error) -> String + '_ {
    move |e| format!("{context}: {e}")
}

fn cpu() -> Result<specula_backend_cpu::CpuDevice, String> {
    specula_backend_cpu::CpuDevice::new().map_err(fail("open cpu"))
}

fn sample(device: &dyn Device, probs: &[f32], vocab: usize) -> Result<Vec<i32>, String> {
    let run = || -> specula_backend_api::Result<Vec<i32>> {
        let rows = probs.len() / vocab;
        let probs = device.upload(probs)?;
        let top_k: Vec<i32> = (0..rows as i32).map(|r| r % 5).collect();
        let top_p: Vec<f32> = (0..rows).map(|r| 0.5 + 0.1 * (r % 5) as f32).collect();
        let seed: Vec<u64> = (0..rows as u64).map(|r| r * 0x9E37_79B9 + 7).collect();
        let (top_k, top_p, seed) = (
            device.upload(&top_k)?,
            device.upload(&top_p)?,
            device.upload(&seed)?,
        );
        let mut tokens = device.alloc::<i32>(rows)?;
        device.top_k_top_p_sample(
            &SampleInputs::new(Scores::Probs(&probs), &top_k, &top_p, &seed),
            &mut tokens,
            &SampleParams {
                shape: RowShape { rows, vocab },
                host_top_p: None,
            },
        )?;
        device.download(&tokens)
    };
    run().map_err(fail("top_k_top_p_sample"))
}

fn launch_shapes_agree_with_the_cpu() -> TestResult {
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
    let expected = sample(&cpu()?, &probs, vocab)?;
    for launch in [
        LaunchConfig::default(),
        LaunchConfig::new(2, 16),
        LaunchConfig::new(3, 5),
    ] {
        let device = open(launch)?;
        if device.launch_config() != launch {
            return Err(format!("opened with {}", device.launch_config()));
        }
        let got = sample(&device, &probs, vocab)?;
        if got != expected {
            return Err(format!("launch {launch}: {got:?} != cpu {expected:?}"));
        }
    }
    Ok(())
}

fn out_of_range_launches_are_unavailable() -> TestResult {
    open(LaunchConfig::new(1, 1))?;
    for (ordinal, launch) in [
        (0, LaunchConfig::new(0, 8)),
        (0, LaunchConfig::new(2, 100_000)),
        (10_000, LaunchConfig::default()),
    ] {
        match XpuSimDevice::with_launch(ordinal, launch) {
            Err(Error::Unavailable { .. }) => {}
            other => return Err(format!("device {ordinal}, launch {launch}: {other:?}")),
        }
    }
    Ok(())
}

/// Every output of `accept_logprobs` for a batch with no live slot and no logits row, over
/// outputs prefilled with garbage (so a pack kernel that did not run would show).
fn logprobs_without_rows(device: &dyn Device, dims: BatchDims) -> Result<Vec<Vec<u32>>, String> {
    let run = || -> specula_backend_api::Result<Vec<Vec<u32>>> {
        let (vocab, top_k) = (4, 2);
        let slot_tokens = dims.max_bsz * dims.max_step_tokens;
        let garbage = |len: usize| vec![7i32; len];
        let logits = device.upload::<f32>(&[])?;
        let temperature = device.upload::<f32>(&[])?;
        let accept_tokens = device.upload(&vec![1i32; slot_tokens])?;
        let accept_num = device.upload(&vec![2i32; dims.max_bsz])?;
        let seq_lens_encoder = device.upload(&vec![0i32; dims.max_bsz])?;
        let cu_seqlens_q_output = device.upload(&vec![0i32; dims.real_bsz + 1])?;
        let mut out = LogprobsBuffers {
            cu_accept: device.upload(&garbage(dims.max_bsz + 1))?,
            token_ids: device.upload(&garbage(slot_tokens))?,
            logprobs: device.upload(&vec![7.0f32; slot_tokens])?,
            ranks: device.upload(&garbage(slot_tokens))?,
            top_ids: device.upload(&garbage(slot_tokens * top_k))?,
            top_logprobs: device.upload(&vec![7.0f32; slot_tokens * top_k])?,
        };
        device.accept_logprobs(
            &LogprobsInputs {
                logits: &logits,
                temperature: &temperature,
                accept_tokens: &accept_tokens,
                accept_num: &accept_num,
                seq_lens_encoder: &seq_lens_encoder,
                cu_seqlens_q_output: &cu_seqlens_q_output,
            },
            &mut out.outputs(),
            &LogprobsParams {
                dims,
                shape: RowShape { rows: 0, vocab },
                top_k,
                host_temperature: None,
            },
        )?;
        let bits = |buffer| -> specula_backend_api::Result<Vec<u32>> {
            device
                .download_bytes(buffer)
                .map(|b| bytemuck::pod_collect_to_vec(&b))
        };
        [
            &out.cu_accept,
            &out.token_ids,
            &out.logprobs,
            &out.ranks,
            &out.top_ids,
            &out.top_logprobs,
        ]
        .into_iter()
        .map(bits)
        .collect()
    };
    run().map_err(fail("accept_logprobs"))
}

fn accept_logprobs_packs_a_batch_without_rows() -> TestResult {
    let (device, cpu) = (open(LaunchConfig::default())?, cpu()?);
    for (max_bsz, real_bsz) in [(3, 0), (0, 0)] {
        let dims = BatchDims::new(max_bsz, real_bsz, 2);
        let got = logprobs_without_rows(&device, dims)?;
        let expected = logprobs_without_rows(&cpu, dims)?;
        if got != expected {
            return Err(format!("{dims:?}: {got:?} != cpu {expected:?}"));
        }
        if got[0].iter().any(|&c| c != 0) {
            return Err(format!("{dims:?}: cu_accept {:?}", got[0]));
        }
    }
    Ok(())
}

/// The scaled logit is `(l − m) / T` (`docs/semantics.md` §5.11, §5.5): logits whose quotients by a tiny
/// temperature would overflow to +inf stay finite differences from the maximum, so the
/// log-probabilities tend to the one-hot of `T = 0` instead of a uniform row over the overflowed
/// entries. (`softmax` of such rows is the golden case `tiny_temperature_one_hot`.)
fn tiny_temperature_logprobs_tend_to_the_one_hot() -> TestResult {
    let device = open(LaunchConfig::default())?;
    let run = || -> specula_backend_api::Result<Vec<f32>> {
        let row = [3e29f32, 1e30, f32::NEG_INFINITY, f32::NAN];
        let (vocab, rows) = (row.len(), 2);
        let logits = device.upload(&[row, row].concat())?;
        let temperature = device.upload(&[1e-10f32; 2])?;
        // One decode slot accepting tokens 1 (scored on row 0) and 0 (on row 1).
        let mut out = LogprobsBuffers::alloc(&device, 1, 2, 0)?;
        device.accept_logprobs(
            &LogprobsInputs {
                logits: &logits,
                temperature: &temperature,
                accept_tokens: &device.upload(&[1i32, 0])?,
                accept_num: &device.upload(&[2i32])?,
                seq_lens_encoder: &device.upload(&[0i32])?,
                cu_seqlens_q_output: &device.upload(&[0i32, 2])?,
            },
            &mut out.outputs(),
            &LogprobsParams {
                dims: BatchDims::new(1, 1, 2),
                shape: RowShape { rows, vocab },
                top_k: 0,
                host_temperature: None,
            },
        )?;
        device.download(&out.logprobs)
    };
    let logprobs = run().map_err(fail("accept_logprobs"))?;
    if logprobs != [0.0, f32::NEG_INFINITY] {
        return Err(format!("accept_logprobs: {logprobs:?}"));
    }
    Ok(())
}

/// Runs `argmax` over bf16 rows and `top_k_top_p_sample` over f32 logits rows.
fn first_ops(device: &XpuSimDevice) -> TestResult {
    testing::first_sampling_ops(device).map_err(fail("the first ops"))
}

/// The warm-up builds programs, a second one builds none, and after it the first op calls build
/// none either; on a cold device the same calls build theirs.
fn warm_up_builds_every_program_once() -> TestResult {
    let cold = open(LaunchConfig::default())?;
    first_ops(&cold)?;
    if cold.programs_built() == 0 {
        return Err("the first calls on a cold device built nothing".to_owned());
    }
    let warm = open(LaunchConfig::default())?;
    warm.warm_up().map_err(fail("warm_up"))?;
    let built = warm.programs_built();
    if built == 0 {
        return Err("warm_up built no program".to_owned());
    }
    warm.warm_up().map_err(fail("second warm_up"))?;
    first_ops(&warm)?;
    match warm.programs_built() {
        after if after == built => Ok(()),
        after => Err(format!(
            "after warm_up, a second warm_up and the first calls built {} programs",
            after - built
        )),
    }
}
