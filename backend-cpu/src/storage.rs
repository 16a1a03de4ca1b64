//! Host memory behind CPU buffers: 8-byte aligned, so every dtype can be viewed in place.

use specula_backend_api::{BackendKind, Buffer, Element, Error, Result};

/// The storage of a CPU buffer. `u64` words keep every element type aligned.
#[derive(Debug)]
pub(crate) struct CpuStorage {
    words: Vec<u64>,
}

impl CpuStorage {
    pub(crate) fn zeroed(bytes: usize) -> Self {
        CpuStorage {
            words: vec![0; bytes.div_ceil(8)],
        }
    }

    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.words)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.words)
    }
}

fn foreign() -> Error {
    // Validation checks the owning device first, so this means a buffer was built by hand with a
    // CPU device id and another backend's storage.
    Error::Execution {
        backend: BackendKind::Cpu,
        what: "buffer access".to_owned(),
        source: "buffer storage is not CPU memory".into(),
    }
}

/// The bytes of a buffer's window.
pub(crate) fn bytes(buffer: &Buffer) -> Result<&[u8]> {
    let size = buffer.dtype().size_bytes();
    let (start, end) = (
        buffer.offset() * size,
        (buffer.offset() + buffer.len()) * size,
    );
    let storage = buffer.storage::<CpuStorage>().ok_or_else(foreign)?;
    Ok(&storage.bytes()[start..end])
}

/// The bytes of a buffer's window, mutably.
pub(crate) fn bytes_mut(buffer: &mut Buffer) -> Result<&mut [u8]> {
    let size = buffer.dtype().size_bytes();
    let (start, end) = (
        buffer.offset() * size,
        (buffer.offset() + buffer.len()) * size,
    );
    let storage = buffer.storage_mut::<CpuStorage>().ok_or_else(foreign)?;
    Ok(&mut storage.bytes_mut()[start..end])
}

/// A buffer's window as a typed slice. The caller has validated the dtype.
pub(crate) fn slice<T: Element>(buffer: &Buffer) -> Result<&[T]> {
    debug_assert_eq!(buffer.dtype(), T::DTYPE);
    Ok(bytemuck::cast_slice(bytes(buffer)?))
}

/// A buffer's window as a mutable typed slice. The caller has validated the dtype.
pub(crate) fn slice_mut<T: Element>(buffer: &mut Buffer) -> Result<&mut [T]> {
    debug_assert_eq!(buffer.dtype(), T::DTYPE);
    Ok(bytemuck::cast_slice_mut(bytes_mut(buffer)?))
}
