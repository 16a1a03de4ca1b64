//! Device memory behind CUDA buffers, and the raw window pointers kernels receive.

use cudarc::driver::sys::CUdeviceptr;
use specula_backend_api::Buffer;

use crate::driver::DeviceBlock;
use crate::error::CudaError;

/// The storage of a CUDA buffer: one byte allocation of this device (at least 8 bytes, a
/// multiple of 8, so every element type is aligned and a zero-length buffer still has a valid
/// address), or a runner's device pointer borrowed as an input
/// ([`CudaDevice::wrap_device_ptr`](crate::CudaDevice::wrap_device_ptr)).
pub(crate) enum CudaStorage {
    /// Memory this device allocated (freed, stream-ordered, on drop), with its address.
    Owned(DeviceBlock),
    /// Memory at `ptr` in the device's context, owned by the runner (never freed here, never
    /// written); the buffer's length is the runner's.
    Borrowed { ptr: CUdeviceptr },
}

impl CudaStorage {
    /// Bytes to allocate for `bytes` of payload.
    pub(crate) fn allocation_bytes(bytes: usize) -> Option<usize> {
        bytes.max(8).checked_next_multiple_of(8)
    }
}

/// The storage of a buffer validated to belong to this device.
pub(crate) fn storage(buffer: &Buffer) -> Result<&CudaStorage, CudaError> {
    buffer
        .storage::<CudaStorage>()
        .ok_or(CudaError::ForeignBuffer)
}

/// The byte range of a buffer's window within its allocation.
pub(crate) fn window_bytes(buffer: &Buffer) -> (usize, usize) {
    let size = buffer.dtype().size_bytes();
    (
        buffer.offset() * size,
        (buffer.offset() + buffer.len()) * size,
    )
}

/// The device address of the first element of a buffer's window: what a kernel receives, so that
/// every op honours windows by construction. No driver call: the address was read when the
/// memory was allocated, and every op of the device runs in order on its one stream (so nothing
/// needs cudarc's per-access events, even on a runner's context that tracks them).
pub(crate) fn window_ptr(buffer: &Buffer) -> Result<u64, CudaError> {
    let base = match storage(buffer)? {
        CudaStorage::Owned(block) => block.ptr(),
        CudaStorage::Borrowed { ptr } => *ptr,
    };
    Ok(base + window_bytes(buffer).0 as u64)
}

/// The window pointer of an optional buffer, 0 (a null pointer) when absent.
pub(crate) fn optional_ptr(buffer: Option<&Buffer>) -> Result<u64, CudaError> {
    buffer.map_or(Ok(0), window_ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_whole_words() {
        assert_eq!(CudaStorage::allocation_bytes(0), Some(8));
        assert_eq!(CudaStorage::allocation_bytes(1), Some(8));
        assert_eq!(CudaStorage::allocation_bytes(9), Some(16));
        assert_eq!(CudaStorage::allocation_bytes(64), Some(64));
        assert_eq!(CudaStorage::allocation_bytes(usize::MAX), None);
    }
}
