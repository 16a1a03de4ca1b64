//! `Device::warm_up` on the adapter: it compiles every pipeline once (a second call compiles
//! nothing), and after it the first call of an op compiles nothing either; without it, that first
//! call compiles its pipeline (so the counter tells).
//!
//! Without a usable adapter the tests are listed as ignored with the reason, and fail under
//! `SPECULA_REQUIRE=wgpu` (`specula_backend_api::testing`).

mod common;

use std::process::ExitCode;

use specula_backend_api::named_tests;
use specula_backend_api::testing::{self, TestFn};
use specula_backend_api::{DType, Device, Op, WarmUp};
use specula_backend_wgpu::WgpuDevice;

fn open() -> Result<WgpuDevice, String> {
    specula_backend_wgpu::open_device(0).map_err(|e| format!("opening wgpu: {e}"))
}

/// Runs `argmax` over bf16 rows and `top_k_top_p_sample` over f32 logits rows.
fn first_ops(device: &WgpuDevice) -> Result<(), String> {
    testing::first_sampling_ops(device).map_err(|e| format!("running the ops: {e}"))
}

/// `Ok` when `device` has compiled no pipeline beyond the `before` it had; else how many `what`
/// compiled.
fn compiled_nothing_more(device: &WgpuDevice, before: usize, what: &str) -> Result<(), String> {
    match device.pipelines_built() {
        after if after == before => Ok(()),
        after => Err(format!("{what} compiled {} pipelines", after - before)),
    }
}

/// The warm-up compiles pipelines, and a second one compiles none.
fn warm_up_compiles_every_pipeline_once() -> Result<(), String> {
    let device = open()?;
    device.warm_up().map_err(|e| format!("warm_up: {e}"))?;
    let built = device.pipelines_built();
    if built == 0 {
        return Err("warm_up compiled no pipeline".to_owned());
    }
    device
        .warm_up()
        .map_err(|e| format!("second warm_up: {e}"))?;
    compiled_nothing_more(&device, built, "a second warm_up")
}

/// After the warm-up the first op calls compile nothing; without it they do.
fn after_warm_up_the_first_call_compiles_nothing() -> Result<(), String> {
    let cold = open()?;
    first_ops(&cold)?;
    if cold.pipelines_built() == 0 {
        return Err("the first calls on a cold device compiled nothing".to_owned());
    }
    let warm = open()?;
    warm.warm_up().map_err(|e| format!("warm_up: {e}"))?;
    let built = warm.pipelines_built();
    first_ops(&warm)?;
    compiled_nothing_more(&warm, built, "the first calls after warm_up")
}

/// A warm-up for the first ops' kernels and dtypes compiles fewer pipelines than the full one,
/// and the first calls then compile nothing.
fn a_planned_warm_up_compiles_only_its_plan() -> Result<(), String> {
    let full = open()?;
    full.warm_up().map_err(|e| format!("warm_up: {e}"))?;
    let some = open()?;
    let plan = WarmUp::new([Op::Argmax, Op::TopKTopPSample], [DType::BF16, DType::F32]);
    some.warm_up_for(&plan)
        .map_err(|e| format!("warm_up_for: {e}"))?;
    let (all, planned) = (full.pipelines_built(), some.pipelines_built());
    if planned == 0 || planned >= all {
        return Err(format!(
            "warm_up_for compiled {planned} pipelines, the full warm-up {all}"
        ));
    }
    first_ops(&some)?;
    compiled_nothing_more(&some, planned, "the first calls after warm_up_for")
}

fn main() -> ExitCode {
    let tests: Vec<(&str, TestFn)> = named_tests![
        warm_up_compiles_every_pipeline_once,
        after_warm_up_the_first_call_compiles_nothing,
        a_planned_warm_up_compiles_only_its_plan,
    ];
    common::run_all_on_wgpu(tests)
}
