//! `ReferenceDevice`: the `Backend` implementation.

use specula_backend_api::backend::{Alloc, AnyCall, Backend, DeviceDesc, Download, Upload, Write};
use specula_backend_api::{BackendKind, Buffer, Capabilities, DType, DeviceInfo, Result};

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
        let capabilities = Capabilities {
            float_dtypes: DType::FLOATS.to_vec(),
            max_buffer_bytes: None,
            logits: true,
            sliced_processing: true,
            processing: true,
            fused_processing: false,
            row_block_bytes: None,
            sharded: true,
        };
        ReferenceDevice {
            desc: DeviceDesc::new(info, capabilities),
        }
    }
}

impl Default for ReferenceDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for ReferenceDevice {
    fn desc(&self) -> &DeviceDesc {
        &self.desc
    }

    fn run_alloc_zeroed(&self, alloc: Alloc) -> Result<Buffer> {
        host::alloc_zeroed(&self.desc, alloc)
    }

    fn run_upload(&self, upload: Upload<'_>) -> Result<Buffer> {
        host::upload(&self.desc, upload)
    }

    fn run_write(&self, write: Write<'_, '_>) -> Result<()> {
        host::write(write)
    }

    fn run_download(&self, download: Download<'_>) -> Result<Vec<u8>> {
        host::download(download)
    }

    fn host_memory(&self) -> bool {
        true
    }

    fn run_synchronize(&self) -> Result<()> {
        // Every op has finished when its call returns.
        Ok(())
    }

    fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
        specula_backend_api::dispatch_ops!(self, call)
    }
}
