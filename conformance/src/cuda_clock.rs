//! The bench's [`DeviceClock`] on a CUDA device: CUDA events around a call
//! ([`KernelTimer`]), the device's read floor ([`CudaDevice::read_floor`]) and captured steps
//! ([`CudaDevice::capture_step`]). Compiled with the `cuda` feature.

use std::cell::OnceCell;
use std::sync::Arc;

use specula_backend_api::{Buffer, DeviceExt, Result};
use specula_backend_cuda::{CapturedStep, CudaDevice, KernelTimer};

use crate::bench::{DeviceClock, Replay};

/// Bytes the cold mode reads between repetitions: several times the L2 of current GPUs (50 MB
/// on an H100, 60 MB on an H200).
const EVICT_BYTES: usize = 256 << 20;

/// A CUDA device's clock for the bench.
pub struct CudaClock {
    device: Arc<CudaDevice>,
    timer: KernelTimer,
    evictor: OnceCell<Buffer>,
}

impl CudaClock {
    /// The clock of `device` (two timing events).
    pub fn new(device: Arc<CudaDevice>) -> Result<Self> {
        let timer = device.kernel_timer()?;
        Ok(CudaClock {
            device,
            timer,
            evictor: OnceCell::new(),
        })
    }
}

/// A captured step and the device it replays on.
struct CudaReplay<'d> {
    device: &'d CudaDevice,
    step: CapturedStep,
}

impl Replay for CudaReplay<'_> {
    fn replay(&self) -> Result<()> {
        self.step.replay(self.device)
    }
}

impl DeviceClock for CudaClock {
    fn start(&self) -> Result<()> {
        self.timer.start(&self.device)
    }

    fn stop(&self) -> Result<()> {
        self.timer.stop(&self.device)
    }

    fn elapsed(&self) -> Result<f64> {
        Ok(self.timer.elapsed(&self.device)?.as_secs_f64())
    }

    fn read_floor(&self, buffer: &Buffer) -> Result<()> {
        self.device.read_floor(buffer)
    }

    fn evict(&self) -> Result<()> {
        if self.evictor.get().is_none() {
            let buffer = self.device.alloc::<u8>(EVICT_BYTES)?;
            // Set once here; a second `set` cannot happen (single-threaded, checked above).
            let _ = self.evictor.set(buffer);
        }
        match self.evictor.get() {
            Some(buffer) => self.device.read_floor(buffer),
            None => Ok(()),
        }
    }

    fn capture<'s>(&'s self, step: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Replay + 's>> {
        let captured = self.device.capture_step(|_| step())?;
        Ok(Box::new(CudaReplay {
            device: &self.device,
            step: captured,
        }))
    }
}
