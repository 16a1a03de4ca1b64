//! Host memory for backends whose buffers live in the process (the CPU backend and the reference
//! device): the storage, the four memory operations on it, and views of a buffer's window.
//!
//! The storage is `u64` words, so that a window of any dtype starts aligned and is viewed in place
//! with `bytemuck` (no `unsafe`). Allocation is fallible: a size the allocator refuses is
//! [`Error::OutOfMemory`], never an abort.
//!
//! A host buffer can also be a caller's slice, lent without a copy for the life of a
//! [`BorrowedInput`] ([`DeviceExt::borrow_host`](crate::DeviceExt::borrow_host)): read-only, and
//! aligned for its dtype because it was a `&[T]`.
//!
//! [`process`] and [`verify`] unpack the inputs of `process_logits` and `verify_draft_tokens`
//! into host slices for both host devices; each applies the rules its own way.

use std::sync::atomic::{AtomicU64, Ordering};

pub use process::ProcessSlices;
pub use verify::VerifySlices;

use crate::call::{Alloc, DeviceDesc, Download, Upload, Write};
use crate::lent::LentBytes;
use crate::{BackendKind, BorrowedInput, Buffer, Element, Error, Result};

pub mod process;
pub mod verify;

/// The memory of one host buffer: owned words, or a caller's lent slice.
#[derive(Debug)]
pub struct HostMemory {
    memory: Memory,
    /// The contents' [`stamp`]: a new one at creation and at every mutable access.
    stamp: u64,
}

/// The next stamp to hand out: stamps are never reused in a process.
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

/// A stamp no host memory has had before.
fn fresh_stamp() -> u64 {
    NEXT_STAMP.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug)]
enum Memory {
    Owned(Vec<u64>),
    Lent(LentBytes),
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
        Ok(HostMemory {
            memory: Memory::Owned(words),
            stamp: fresh_stamp(),
        })
    }

    /// Every byte of the allocation.
    fn all(&self) -> &[u8] {
        match &self.memory {
            Memory::Owned(words) => bytemuck::cast_slice(words),
            Memory::Lent(lent) => lent.as_slice(),
        }
    }

    /// Every byte of the allocation, mutably; an error for a lent (read-only) slice. The
    /// contents take a new stamp: the caller may write them.
    fn all_mut(&mut self) -> Result<&mut [u8]> {
        self.stamp = fresh_stamp();
        match &mut self.memory {
            Memory::Owned(words) => Ok(bytemuck::cast_slice_mut(words)),
            Memory::Lent(_) => Err(fault("a borrowed host input is read-only")),
        }
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

/// The [`Backend`](crate::Backend) methods every host-memory device writes the same way, for the
/// CPU backend and the reference alike: `desc` (the device's `desc` field), `run_alloc_zeroed`,
/// `run_upload` and `run_download` through this module, `host_memory` (true) and
/// `run_synchronize` (nothing to wait for: every op has finished when its call returns). Each
/// device writes `run_write` (the CPU backend marks the count tables a write covers) and `run`.
#[macro_export]
macro_rules! host_memory_backend {
    () => {
        fn desc(&self) -> &$crate::backend::DeviceDesc {
            &self.desc
        }

        fn run_alloc_zeroed(
            &self,
            alloc: $crate::backend::Alloc,
        ) -> $crate::Result<$crate::Buffer> {
            $crate::host::alloc_zeroed(&self.desc, alloc)
        }

        fn run_upload(
            &self,
            upload: $crate::backend::Upload<'_>,
        ) -> $crate::Result<$crate::Buffer> {
            $crate::host::upload(&self.desc, upload)
        }

        fn run_download(&self, download: $crate::backend::Download<'_>) -> $crate::Result<Vec<u8>> {
            $crate::host::download(download)
        }

        fn host_memory(&self) -> bool {
            true
        }

        fn run_synchronize(&self) -> $crate::Result<()> {
            Ok(())
        }
    };
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

/// The stamp of a host buffer's contents (its whole allocation), or `None` when its storage is
/// not host memory. Every mutable access to the allocation ([`bytes_mut`], and so every write,
/// upload and op output) gives it a stamp never handed out before, so a device may keep
/// something derived from a buffer's contents between calls and know it is still current while
/// the stamp it recorded is the buffer's.
pub fn stamp(buffer: &Buffer) -> Option<u64> {
    buffer.storage::<HostMemory>().map(|memory| memory.stamp)
}

/// The bytes of a host buffer's window.
pub fn bytes(buffer: &Buffer) -> Result<&[u8]> {
    let range = window(buffer);
    let memory = buffer
        .storage::<HostMemory>()
        .ok_or_else(|| fault("the storage is not host memory"))?;
    memory
        .all()
        .get(range)
        .ok_or_else(|| fault("the window is outside the allocation"))
}

/// The bytes of a host buffer's window, mutably.
pub fn bytes_mut(buffer: &mut Buffer) -> Result<&mut [u8]> {
    let range = window(buffer);
    let memory = buffer
        .storage_mut::<HostMemory>()
        .ok_or_else(|| fault("the storage is not host memory"))?;
    memory
        .all_mut()?
        .get_mut(range)
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

/// `data` lent without a copy to the host-memory device `desc` describes, as a buffer of
/// `alloc` (validated to be `data`'s dtype and length).
pub(crate) fn lend<'a, T: Element>(
    desc: &DeviceDesc,
    alloc: Alloc,
    data: &'a [T],
) -> BorrowedInput<'a> {
    let memory = HostMemory {
        memory: Memory::Lent(LentBytes::new(bytemuck::cast_slice(data))),
        stamp: fresh_stamp(),
    };
    BorrowedInput::new(
        Buffer::from_storage(alloc.dtype(), alloc.len(), desc.id, Box::new(memory)),
        true,
    )
}
