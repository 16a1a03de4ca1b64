//! Shared by the wgpu integration tests.

use std::process::ExitCode;
use std::sync::Arc;

use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::{Device, Error};

/// Runs the one test `name` on wgpu device 0. Without a usable adapter the test is listed as
/// ignored with the reason, and fails under `SPECULA_REQUIRE=wgpu`.
pub fn run_on_wgpu(
    name: &'static str,
    body: fn(Arc<dyn Device>) -> Result<(), String>,
) -> ExitCode {
    let opened = specula_backend_wgpu::open(0);
    let availability = match &opened {
        Err(Error::Unavailable { reason, .. }) => Err(reason.clone()),
        _ => Ok(()),
    };
    let needs = Needs::new("wgpu", availability);
    let test: TestFn = Box::new(move || {
        let wgpu = opened.map_err(|e| format!("opening wgpu: {e}"))?;
        body(wgpu)
    });
    testing::run(&needs, vec![(name, test)])
}
