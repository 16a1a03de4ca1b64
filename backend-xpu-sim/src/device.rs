//! `XpuSimDevice`: the [`Backend`] over the OpenCL runtime. The front of `backend-api` validates
//! every call before it gets here; each op's host code is in `ops/<op>.rs`, beside its kernel file
//! `kernels/<op>.cl`.

use specula_backend_api::WarmUp;
use specula_backend_api::backend::{Alloc, AnyCall, Backend, DeviceDesc, Download, Upload, Write};
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, DeviceInfo, Error, PendingDownload, Result,
};

use crate::error::XpuSimError;
use crate::launch::LaunchConfig;
use crate::ops::{self, kernel_programs};
use crate::runtime::{ClStorage, Runtime};

/// An OpenCL device running the XPU-style kernels.
pub struct XpuSimDevice {
    desc: DeviceDesc,
    runtime: Runtime,
}

impl std::fmt::Debug for XpuSimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XpuSimDevice")
            .field("id", &self.desc.id.0)
            .field("info", &self.desc.info)
            .field("launch", &self.runtime.launch)
            .finish_non_exhaustive()
    }
}

fn storage_mut(buffer: &mut Buffer) -> Result<&mut ClStorage> {
    buffer
        .storage_mut::<ClStorage>()
        .ok_or_else(|| XpuSimError::ForeignStorage.into_execution("buffer access"))
}

fn storage(buffer: &Buffer) -> Result<&ClStorage> {
    buffer
        .storage::<ClStorage>()
        .ok_or_else(|| XpuSimError::ForeignStorage.into_execution("buffer access"))
}

/// The byte offset of a buffer's window.
fn byte_offset(buffer: &Buffer) -> usize {
    buffer.offset() * buffer.dtype().size_bytes()
}

impl XpuSimDevice {
    /// Opens OpenCL device `ordinal` (counted over every platform and device type, CPU devices
    /// included) with the launch shape `launch`.
    pub fn with_launch(ordinal: usize, launch: LaunchConfig) -> Result<Self> {
        let runtime = Runtime::open(ordinal, launch)?;
        let info = DeviceInfo {
            kind: BackendKind::XpuSim,
            ordinal,
            name: runtime.name.clone(),
            driver: runtime.driver.clone(),
        };
        let capabilities = Capabilities {
            max_buffer_bytes: Some(runtime.max_alloc),
            ..Capabilities::every_op()
        };
        Ok(XpuSimDevice {
            desc: DeviceDesc::new(info, capabilities),
            runtime,
        })
    }

    /// Opens OpenCL device `ordinal` with the launch shape of `SPECULA_XPU_SIM_LAUNCH` (default
    /// 8x64).
    pub fn new(ordinal: usize) -> Result<Self> {
        let launch = LaunchConfig::from_env().map_err(|e| Error::Unavailable {
            backend: BackendKind::XpuSim,
            reason: e.to_string(),
        })?;
        Self::with_launch(ordinal, launch)
    }

    /// A new buffer for `alloc`, its storage first filled by `fill`.
    fn allocate(
        &self,
        alloc: Alloc,
        fill: impl FnOnce(&mut ClStorage) -> Result<()>,
    ) -> Result<Buffer> {
        let mut storage = self.runtime.alloc(alloc.bytes())?;
        fill(&mut storage)?;
        Ok(Buffer::from_storage(
            alloc.dtype(),
            alloc.len(),
            self.desc.id,
            Box::new(storage),
        ))
    }

    /// The launch shape every kernel uses.
    pub fn launch_config(&self) -> LaunchConfig {
        self.runtime.launch
    }

    /// How many OpenCL programs this device has built so far (each once, then cached): after
    /// [`Device::warm_up`](specula_backend_api::Device::warm_up) no op call adds to it.
    pub fn programs_built(&self) -> usize {
        self.runtime.programs_built()
    }
}

impl Backend for XpuSimDevice {
    fn desc(&self) -> &DeviceDesc {
        &self.desc
    }

    fn run_alloc_zeroed(&self, alloc: Alloc) -> Result<Buffer> {
        self.allocate(alloc, |storage| {
            self.runtime.zero(storage, 0, alloc.bytes())
        })
    }

    fn run_upload(&self, upload: Upload<'_>) -> Result<Buffer> {
        self.allocate(upload.alloc(), |storage| {
            self.runtime.write(storage, 0, upload.bytes())
        })
    }

    fn run_write(&self, mut write: Write<'_, '_>) -> Result<()> {
        let (dst, bytes) = write.parts();
        let offset = byte_offset(dst);
        self.runtime.write(storage_mut(dst)?, offset, bytes)
    }

    fn run_download(&self, download: Download<'_>) -> Result<Vec<u8>> {
        let src = download.src();
        let mut out = vec![0u8; src.size_bytes()];
        self.runtime
            .read(storage(src)?, byte_offset(src), &mut out)?;
        Ok(out)
    }

    fn run_synchronize(&self) -> Result<()> {
        self.runtime.finish()
    }

    /// Non-blocking reads of every window and one flush; [`PendingDownload::wait`] waits once.
    fn run_start_download(&self, downloads: &[Download<'_>]) -> Result<PendingDownload> {
        let windows = downloads
            .iter()
            .map(|d| {
                let src = d.src();
                Ok((storage(src)?, byte_offset(src), src.size_bytes()))
            })
            .collect::<Result<Vec<_>>>()?;
        self.runtime.start_read(&windows)
    }

    fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
        specula_backend_api::dispatch_ops!(&self.runtime, call)
    }

    /// Builds every program of the plan's ops, for every build option their host code may use
    /// with score rows of the plan's dtypes (row kinds, strategies), and creates their kernels.
    fn run_warm_up(&self, plan: &WarmUp) -> Result<()> {
        for &op in plan.ops() {
            for (key, kernels) in kernel_programs(op, plan) {
                for kernel in &kernels {
                    self.runtime.prepare(&key, kernel)?;
                }
            }
        }
        Ok(())
    }
}
