//! `ReferenceDevice`: the `Backend` implementation.

use specula_backend_api::backend::{AnyCall, Backend, DeviceDesc, Write};
use specula_backend_api::{BackendKind, Capabilities, DeviceInfo, Result};

use crate::ops;
use specula_backend_api::host;

/// The plain reference device: host memory, one thread, every op written the obvious way.
///
/// Its [`DeviceInfo`] has kind [`BackendKind::Cpu`] (the kinds name the production backends; this
/// device is not one of them), name `reference` and driver `plain Rust, single-threaded`. It
/// accepts f32, f16 and bf16 and has no buffer size limit beyond the host's memory.
#[derive(Debug)]
pub struct ReferenceDevice {
    desc: DeviceDesc,
}

impl ReferenceDevice {
    /// Opens a reference device (it cannot fail: it needs nothing but host memory).
    pub fn new() -> Self {
        let info = DeviceInfo {
            kind: BackendKind::Cpu,
            ordinal: 0,
            name: "reference".to_owned(),
            driver: "plain Rust, single-threaded".to_owned(),
        };
        ReferenceDevice {
            desc: DeviceDesc::new(info, Capabilities::every_op()),
        }
    }
}

impl Default for ReferenceDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for ReferenceDevice {
    specula_backend_api::host_memory_backend!();

    fn run_write(&self, write: Write<'_, '_>) -> Result<()> {
        host::write(write)
    }

    fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
        specula_backend_api::dispatch_ops!(self, call)
    }
}
