//! Host memory for backends whose buffers live in the process (the CPU backend and the reference
//! device): the storage, the four memory operations on it, and views of a buffer's window.
//!
//! The storage is `u64` words, so that a window of any dtype starts aligned and is viewed in place
//! with `bytemuck` (no `unsafe`). Allocation is fallible: a size the allocator refuses is
//! [`Error::OutOfMemory`], never an abort.

use crate::backend::{Alloc, DeviceDesc, Download, Upload, Write};
use crate::{BackendKind, Buffer, Element, Error, Result};

/// The memory of one host buffer.
#[derive(Debug)]
pub struct HostMemory {
    words: Vec<u64>,
}

impl HostMemory {
    /// `bytes` zeroed bytes (rounded up to whole words), or `OutOfMemory` for `backend`.
    pub fn zeroed(backend: BackendKind, bytes: usize) -> Result<Self> {
        let len = bytes.div_ceil(8);
        let mut words = Vec::new();
        words
            .try_reserve_exact(len)
            .map_err(|_| Error::OutOfMemory {
                backend,
                requested_bytes: bytes,
            })?;
        words.resize(len, 0);
        Ok(HostMemory { words })
    }
}

/// A zeroed host buffer for `alloc`, owned by the device `desc` describes.
pub fn alloc_zeroed(desc: &DeviceDesc, alloc: Alloc) -> Result<Buffer> {
    let memory = HostMemory::zeroed(desc.info.kind, alloc.bytes())?;
    Ok(Buffer::from_storage(
        alloc.dtype(),
        alloc.len(),
        desc.id,
        Box::new(memory),
    ))
}

/// A host buffer holding the upload's bytes.
pub fn upload(desc: &DeviceDesc, upload: Upload<'_>) -> Result<Buffer> {
    let mut buffer = alloc_zeroed(desc, upload.alloc())?;
    bytes_mut(&mut buffer)?.copy_from_slice(upload.bytes());
    Ok(buffer)
}

/// Overwrites a host buffer's window.
pub fn write(mut write: Write<'_, '_>) -> Result<()> {
    let (dst, bytes) = write.parts();
    bytes_mut(dst)?.copy_from_slice(bytes);
    Ok(())
}

/// A copy of a host buffer's window.
pub fn download(download: Download<'_>) -> Result<Vec<u8>> {
    Ok(bytes(download.src())?.to_vec())
}

/// An internal fault: a buffer whose storage is not host memory, or a window outside its
/// allocation. Validation rules both out, so this reports a broken invariant (never a panic).
fn fault(what: &str) -> Error {
    Error::Execution {
        backend: BackendKind::Cpu,
        what: "host buffer access".to_owned(),
        source: what.to_owned().into(),
    }
}

/// The byte range of a buffer's window within its allocation.
fn window(buffer: &Buffer) -> std::ops::Range<usize> {
    let size = buffer.dtype().size_bytes();
    buffer.offset() * size..(buffer.offset() + buffer.len()) * size
}

/// The bytes of a host buffer's window.
pub fn bytes(buffer: &Buffer) -> Result<&[u8]> {
    let range = window(buffer);
    let memory = buffer
        .storage::<HostMemory>()
        .ok_or_else(|| fault("the storage is not host memory"))?;
    let all: &[u8] = bytemuck::cast_slice(&memory.words);
    all.get(range)
        .ok_or_else(|| fault("the window is outside the allocation"))
}

/// The bytes of a host buffer's window, mutably.
pub fn bytes_mut(buffer: &mut Buffer) -> Result<&mut [u8]> {
    let range = window(buffer);
    let memory = buffer
        .storage_mut::<HostMemory>()
        .ok_or_else(|| fault("the storage is not host memory"))?;
    let all: &mut [u8] = bytemuck::cast_slice_mut(&mut memory.words);
    all.get_mut(range)
        .ok_or_else(|| fault("the window is outside the allocation"))
}

/// A host buffer's window as `&[T]` (validation has checked the dtype).
pub fn slice<T: Element>(buffer: &Buffer) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes(buffer)?).map_err(|_| fault("misaligned or partial element"))
}

/// A host buffer's window as `&mut [T]` (validation has checked the dtype).
pub fn slice_mut<T: Element>(buffer: &mut Buffer) -> Result<&mut [T]> {
    bytemuck::try_cast_slice_mut(bytes_mut(buffer)?)
        .map_err(|_| fault("misaligned or partial element"))
}
