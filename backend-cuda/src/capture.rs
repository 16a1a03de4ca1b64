//! A decoder step recorded once as a CUDA graph and replayed with one launch
//! ([`CudaDevice::capture_step`]).

use std::sync::Arc;

use cudarc::driver::CudaGraph;
use specula_backend_api::{DeviceId, Error, Op, Result};

use crate::device::CudaDevice;
use crate::driver::{DeviceBlock, Driver};
use crate::error::CudaError;

/// A step captured by [`CudaDevice::capture_step`]: every kernel the step enqueued, recorded with
/// its arguments as they were, replayed on the device's stream by one graph launch.
///
/// It keeps the device's scratch blocks of the capture alive, so the arena may grow afterwards.
/// It does not keep the step's buffers alive: they must outlive every replay (see
/// [`CudaDevice::capture_step`]). Not `Send`: replay it on the thread that holds it.
pub struct CapturedStep {
    graph: CudaGraph,
    device: DeviceId,
    /// Kernels launched while recording (what one replay runs).
    kernels: u64,
    _scratch: Vec<Arc<DeviceBlock>>,
}

impl std::fmt::Debug for CapturedStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedStep")
            .field("device", &self.device)
            .field("kernels", &self.kernels)
            .finish_non_exhaustive()
    }
}

impl CapturedStep {
    /// The kernels one replay runs.
    pub fn kernels(&self) -> u64 {
        self.kernels
    }

    /// Enqueues the whole step on `device`'s stream with one launch, behind everything enqueued
    /// before (a runner's forward pass on the same stream included); returns without waiting.
    /// Its outputs are read as after the step's own calls (a download waits for them).
    ///
    /// [`Error::DeviceMismatch`] on another device than the one it was captured on;
    /// [`Error::Unsupported`] while a step is being captured.
    pub fn replay(&self, device: &CudaDevice) -> Result<()> {
        let id = specula_backend_api::Device::id(device);
        if id != self.device {
            return Err(Error::DeviceMismatch {
                op: Op::Memory,
                arg: "captured step",
                expected: self.device.0,
                actual: id.0,
            });
        }
        device
            .driver
            .launch_graph(&self.graph)
            .map_err(|e| device.api_error_for(e, Op::Memory, "replay"))
    }
}

impl CudaDevice {
    /// Records `step` (the calls it makes on this device) as one CUDA graph instead of running
    /// it, for a decoder step whose shapes repeat: [`CapturedStep::replay`] then enqueues all its
    /// kernels with one launch, so the host's cost of a step is one call whatever the step holds.
    ///
    /// What the step did is recorded as it was: the same buffers (their addresses and windows),
    /// the same shapes and every host-side parameter. Buffer *contents* are read at replay time:
    /// a runner writes the step's inputs (or its forward pass leaves them on the stream) and
    /// replays. So the step's buffers must stay alive and unmoved for every replay, and a step
    /// whose shapes, windows or host parameters change needs a new capture.
    ///
    /// Only kernel launches can be recorded. Anything else the step asks for is refused with
    /// [`Error::Unsupported`] and the capture is abandoned (nothing runs): an allocation
    /// (`alloc`, `upload`, or scratch the arena does not hold yet), a copy (`write`, downloads),
    /// a wait (`synchronize`), or building a kernel. Run the step once on the same shapes before
    /// capturing it: that builds its kernels and grows the arena to what it needs. A few rows of
    /// a large vocabulary are sampled with one block per row in a captured step (the same
    /// tokens; the cooperative split has no fallback inside a graph). The step may call ops on
    /// this device only, from this thread; another thread must not use the device meanwhile
    /// (its launches would be recorded into the step).
    ///
    /// Errors: what `step` returned (the capture is abandoned), [`Error::Unsupported`] for a
    /// capture inside a capture, [`Error::InvalidArgument`] when the step launched nothing, or
    /// [`Error::Execution`] when the driver refuses the capture.
    pub fn capture_step(&self, step: impl FnOnce(&Self) -> Result<()>) -> Result<CapturedStep> {
        let capture_error = |e| self.api_error_for(e, Op::Memory, "capture");
        let before = self.driver.counters().snapshot().launches;
        let capture = Capture::begin(&self.driver).map_err(capture_error)?;
        let recorded = step(self);
        let ended = capture.end();
        recorded?;
        let kernels = self.driver.counters().snapshot().launches - before;
        let nothing = || {
            Error::invalid(
                Op::Memory,
                "captured step",
                "a step that launches at least one kernel",
                "no launch",
            )
        };
        let graph = ended.map_err(capture_error)?.ok_or_else(nothing)?;
        if kernels == 0 {
            return Err(nothing());
        }
        let scratch = self
            .scratch
            .lock()
            .map_err(|_| CudaError::Poisoned.into_api("capture"))?
            .blocks();
        Ok(CapturedStep {
            graph,
            device: specula_backend_api::Device::id(self),
            kernels,
            _scratch: scratch,
        })
    }
}

/// A capture in progress: ended by [`Capture::end`], or on drop (a step that panicked leaves the
/// stream running normally again).
struct Capture<'d> {
    driver: &'d Driver,
    open: bool,
}

impl<'d> Capture<'d> {
    fn begin(driver: &'d Driver) -> std::result::Result<Self, CudaError> {
        driver.begin_capture()?;
        Ok(Capture { driver, open: true })
    }

    fn end(mut self) -> std::result::Result<Option<CudaGraph>, CudaError> {
        self.open = false;
        self.driver.end_capture()
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if self.open
            && let Err(error) = self.driver.end_capture()
        {
            tracing::warn!(%error, "cannot end an abandoned capture");
        }
    }
}
