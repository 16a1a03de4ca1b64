//! What a benchmark measures on the device itself: the time between two points of the stream
//! (CUDA events, [`KernelTimer`]) and the device's read floor, a kernel that reads the same bytes
//! as an op once ([`CudaDevice::read_floor`]).

use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaFunction};
use cudarc::nvrtc::Ptx;
use specula_backend_api::{BackendKind, Buffer, Error, Op, Result};

use crate::device::CudaDevice;
use crate::driver::DeviceBlock;
use crate::error::CudaError;
use crate::kernels::FloorArgs;
use crate::{kernels, nvrtc, storage};

/// Threads per block of the read-floor kernel.
const FLOOR_BLOCK: u32 = 256;
/// Resident blocks of the read-floor kernel per multiprocessor (2048 threads).
const FLOOR_BLOCKS_PER_SM: u32 = 8;

/// The device time between two points of a device's stream, by a pair of CUDA events:
/// [`KernelTimer::start`] and [`KernelTimer::stop`] record them behind what is enqueued so far,
/// [`KernelTimer::elapsed`] waits for the second and reads the time between them (the driver's
/// resolution is about half a microsecond). For benchmarks: it is not an op.
pub struct KernelTimer {
    start: CudaEvent,
    end: CudaEvent,
}

impl std::fmt::Debug for KernelTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelTimer").finish_non_exhaustive()
    }
}

impl KernelTimer {
    /// Marks the start, behind everything enqueued on `device` so far.
    pub fn start(&self, device: &CudaDevice) -> Result<()> {
        device.driver.record(&self.start).map_err(timing_error)
    }

    /// Marks the end, behind everything enqueued on `device` so far.
    pub fn stop(&self, device: &CudaDevice) -> Result<()> {
        device.driver.record(&self.end).map_err(timing_error)
    }

    /// Waits for the end mark (one synchronisation) and returns the device time since the start.
    pub fn elapsed(&self, device: &CudaDevice) -> Result<Duration> {
        let ms = device
            .driver
            .elapsed_ms(&self.start, &self.end)
            .map_err(timing_error)?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

/// A timing call's error.
fn timing_error(error: CudaError) -> Error {
    error.into_api("kernel timing")
}

/// The read-floor kernel and the word it may write.
pub(crate) struct FloorKernel {
    function: CudaFunction,
    sink: DeviceBlock,
}

impl CudaDevice {
    /// A pair of timing events on this device ([`KernelTimer`]).
    pub fn kernel_timer(&self) -> Result<KernelTimer> {
        let event = || self.driver.new_event(true).map_err(timing_error);
        Ok(KernelTimer {
            start: event()?,
            end: event()?,
        })
    }

    /// Enqueues one read of `buffer`'s window by a kernel that does nothing else (16-byte loads,
    /// every multiprocessor busy): the device's floor for an op that must read those bytes, to
    /// time with a [`KernelTimer`] next to the op. Compiled by NVRTC at first use.
    pub fn read_floor(&self, buffer: &Buffer) -> Result<()> {
        let floor = self.floor_kernel()?;
        let src = storage::window_ptr(buffer).map_err(|e| e.into_api("read floor"))?;
        let bytes = buffer.size_bytes() as u64;
        let grid = kernels::floor_blocks(bytes, self.multiprocessors * FLOOR_BLOCKS_PER_SM);
        let args = FloorArgs {
            src,
            bytes,
            sink: floor.sink.ptr(),
        };
        // SAFETY: the kernel's `FloorArgs` is generated from this one's declaration (with
        // `static_assert`s of its layout, `kernels::read_floor_source`); the kernel reads `bytes` bytes at `src` (the buffer's validated window) and may write the
        // 8-byte sink this device owns.
        unsafe {
            self.driver
                .launch(&floor.function, (grid, 1, 1), FLOOR_BLOCK, &args, false)
        }
        .map_err(|e| CudaError::driver("cuLaunchKernel", e).into_api("read floor"))
    }

    /// The read-floor kernel, built and loaded at first use.
    fn floor_kernel(&self) -> Result<&FloorKernel> {
        if let Some(floor) = self.floor.get() {
            return Ok(floor);
        }
        let build_error = |log: String| Error::KernelBuild {
            backend: BackendKind::Cuda,
            kernel: format!("read_floor.cu for {}", self.target()),
            log,
        };
        let _one_at_a_time = crate::device::one_build_at_a_time();
        let compiled = nvrtc::compile(
            &kernels::read_floor_source(),
            "read_floor.cu",
            &kernels::floor_options(self.target()),
        )
        .map_err(|e| match e {
            CudaError::Compile { log, .. } => build_error(log),
            other => other.into_api("read floor"),
        })?;
        let ptx = match compiled.image {
            nvrtc::Image::Cubin(bytes) => Ptx::from_binary(bytes),
            nvrtc::Image::Ptx(bytes) => Ptx::from_src(nvrtc::ptx_text(&bytes)),
        };
        let module = self
            .driver
            .ctx
            .load_module(ptx)
            .map_err(|e| CudaError::driver("cuModuleLoadData", e).into_api("read floor"))?;
        let function = module
            .load_function("read_floor")
            .map_err(|e| CudaError::driver("cuModuleGetFunction", e).into_api("read floor"))?;
        let sink = self
            .driver
            .alloc_zeroed(8)
            .map_err(|e| self.api_error_for(e, Op::Memory, "read floor"))?;
        Ok(self.floor.get_or_init(|| FloorKernel { function, sink }))
    }
}
