//! A runner's own CUDA objects: a [`CudaDevice`] on the runner's context and stream, and the
//! runner's device pointers as input buffers without a copy.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUdeviceptr;
use specula_backend_api::{BorrowedInput, Buffer, DType, Device, Error, Op, Result};

use crate::device::CudaDevice;
use crate::storage::CudaStorage;

impl CudaDevice {
    /// Opens Specula on the runner's own cudarc stream (and so its context): every op is
    /// enqueued on `stream`, after the runner's work on it, so a step's inputs written there by
    /// the forward pass are read in order, and device pointers of the runner's context can be
    /// inputs ([`CudaDevice::wrap_device_ptr`]). The context keeps the runner's event-tracking
    /// setting. [`Error::Unavailable`] as for [`CudaDevice::new`] (driver, NVRTC, compute
    /// capability).
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let versions = Self::probe()?;
        Self::on_stream(stream.context().clone(), stream, versions)
    }

    /// The stream every op of this device is enqueued on.
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.driver.stream
    }

    /// The runner's device memory at `ptr`, read as `len` elements of `dtype`, as an input buffer
    /// of this device without a copy, for `'a` (the borrow the caller chooses; tie it to the
    /// allocation's owner). It is an input of any op or of `Decoder::finish`, never an output,
    /// and validated there like any buffer; downloading it copies it to the host.
    ///
    /// `ptr` must be non-null and aligned for `dtype` (else [`Error::InvalidArgument`]), and
    /// `len · dtype` must not overflow.
    ///
    /// # Safety
    ///
    /// For all of `'a`, `ptr .. ptr + len · dtype.size_bytes()` must be memory of this device's
    /// CUDA context that stays allocated and that nothing writes while an op reading it may run:
    /// writes ordered on this device's stream before the op (the forward pass on the same stream)
    /// and after it are fine; writes on another stream must be ordered by the runner (an event).
    pub unsafe fn wrap_device_ptr<'a>(
        &self,
        ptr: CUdeviceptr,
        dtype: DType,
        len: usize,
    ) -> Result<BorrowedInput<'a>> {
        let invalid = |expected: &str, actual: String| {
            Error::invalid(Op::Memory, "device pointer", expected, actual)
        };
        if ptr == 0 || !ptr.is_multiple_of(dtype.size_bytes() as u64) {
            return Err(invalid(
                &format!("a non-null address aligned for {dtype}"),
                format!("{ptr:#x}"),
            ));
        }
        let end = len
            .checked_mul(dtype.size_bytes())
            .and_then(|bytes| ptr.checked_add(bytes as u64));
        if end.is_none() {
            return Err(invalid(
                "a range inside the address space",
                format!("{len} × {dtype} from {ptr:#x}"),
            ));
        }
        let storage = CudaStorage::Borrowed { ptr };
        let buffer = Buffer::from_storage(dtype, len, self.id(), Box::new(storage));
        Ok(BorrowedInput::new(buffer, true))
    }
}
