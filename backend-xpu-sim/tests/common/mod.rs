//! Shared by the xpu-sim integration tests: opening the device, and running a test list that is
//! reported as ignored (with the reason) without an OpenCL device, failing under
//! `SPECULA_REQUIRE=xpu-sim`.

use std::process::ExitCode;

use specula_backend_api::Error;
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_xpu_sim::{LaunchConfig, XpuSimDevice};

/// Runs `tests` if an OpenCL device opens; else lists them as ignored with the reason.
pub fn run_all_on_xpu_sim(tests: Vec<(&str, TestFn)>) -> ExitCode {
    testing::run(&Needs::new("xpu-sim", availability()), tests)
}

/// `Err(reason)` when there is no OpenCL device. Any other error opening it is not a missing
/// device: the tests run and report it.
fn availability() -> Result<(), String> {
    match XpuSimDevice::with_launch(0, LaunchConfig::default()) {
        Err(Error::Unavailable { reason, .. }) => Err(reason),
        Ok(_) | Err(_) => Ok(()),
    }
}

/// The first OpenCL device under `launch`, or the error opening it as a test failure.
pub fn open(launch: LaunchConfig) -> Result<XpuSimDevice, String> {
    XpuSimDevice::with_launch(0, launch).map_err(|e| format!("open: {e}"))
}
