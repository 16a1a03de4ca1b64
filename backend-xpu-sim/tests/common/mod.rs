//! Shared by the xpu-sim integration tests: opening the device, and running a test list that is
//! reported as ignored (with the reason) without an OpenCL device, failing under
//! `SPECULA_REQUIRE=xpu-sim`.

use std::process::ExitCode;

use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_xpu_sim::{LaunchConfig, XpuSimDevice};

/// Runs `tests` if an OpenCL device opens; else lists them as ignored with the reason.
pub fn run_all_on_xpu_sim(tests: Vec<(&str, TestFn)>) -> ExitCode {
    let opened = XpuSimDevice::with_launch(0, LaunchConfig::default());
    testing::run(&Needs::of_open("xpu-sim", &opened), tests)
}

/// The first OpenCL device under `launch`, or the error opening it as a test failure.
pub fn open(launch: LaunchConfig) -> Result<XpuSimDevice, String> {
    XpuSimDevice::with_launch(0, launch).map_err(|e| format!("open: {e}"))
}
