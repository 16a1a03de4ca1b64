//! Shared by the wgpu integration tests.
#![allow(dead_code)] // each test file uses part of it

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
    let needs = needs_of(&opened);
    let test: TestFn = Box::new(move || {
        let wgpu = opened.map_err(|e| format!("opening wgpu: {e}"))?;
        body(wgpu)
    });
    testing::run(&needs, vec![(name, test)])
}

/// What the wgpu tests need, from an attempt to open device 0: missing (with the reason) when it
/// is unavailable.
pub fn needs_of<T>(opened: &Result<T, Error>) -> Needs {
    Needs::of_open("wgpu", opened)
}

/// Runs `tests` if wgpu device 0 opens; else lists them as ignored with the reason (failing under
/// `SPECULA_REQUIRE=wgpu`).
pub fn run_all_on_wgpu(tests: Vec<(&str, TestFn)>) -> ExitCode {
    testing::run(&needs_of(&specula_backend_wgpu::open_device(0)), tests)
}
