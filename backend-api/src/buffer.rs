//! Device-owned buffers.

use std::any::Any;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{DType, Error, Op, Result};

/// Identifies one opened device; every buffer records the device that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId(pub u64);

impl DeviceId {
    /// A process-unique id for a newly opened device.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DeviceId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A typed allocation owned by one device.
///
/// A buffer knows its dtype, its owning device and its *window*: ops read and write only the
/// elements `offset .. offset + len` of the allocation. A fresh buffer's window is the whole
/// allocation; [`Buffer::set_window`] narrows it (the conformance suite uses this to surround an
/// output with guard regions it can check afterwards). Buffers are not `Clone`: copies are explicit.
/// The storage is freed on drop.
pub struct Buffer {
    dtype: DType,
    offset: usize,
    len: usize,
    capacity: usize,
    device: DeviceId,
    storage: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("dtype", &self.dtype)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("device", &self.device.0)
            .finish_non_exhaustive()
    }
}

impl Buffer {
    /// Wraps a backend's storage. Called by backends only; `capacity` is in elements.
    pub fn from_storage(
        dtype: DType,
        capacity: usize,
        device: DeviceId,
        storage: Box<dyn Any + Send + Sync>,
    ) -> Self {
        Buffer {
            dtype,
            offset: 0,
            len: capacity,
            capacity,
            device,
            storage,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements in the window (what ops see).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First element of the window within the allocation.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements in the whole allocation.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Size of the window in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len * self.dtype.size_bytes()
    }

    /// The owning device.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// Restricts the window to `offset .. offset + len` of the allocation.
    pub fn set_window(&mut self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.capacity => {
                self.offset = offset;
                self.len = len;
                Ok(())
            }
            _ => Err(Error::invalid(
                Op::Memory,
                "window",
                format!("offset + len <= capacity {}", self.capacity),
                format!("offset {offset}, len {len}"),
            )),
        }
    }

    /// Restores the window to the whole allocation.
    pub fn reset_window(&mut self) {
        self.offset = 0;
        self.len = self.capacity;
    }

    /// The backend's storage, for the owning backend to downcast.
    pub fn storage<S: Any>(&self) -> Option<&S> {
        self.storage.downcast_ref()
    }

    /// The backend's storage, mutably, for the owning backend to downcast.
    pub fn storage_mut<S: Any>(&mut self) -> Option<&mut S> {
        self.storage.downcast_mut()
    }
}

/// An input buffer made from memory the caller owns, borrowed for `'a`: a host slice
/// ([`DeviceExt::borrow_host`](crate::DeviceExt::borrow_host)) or a device allocation of the
/// runner's (a `wgpu::Buffer`, a CUDA device pointer: see those backends).
///
/// It dereferences to `&Buffer` only, so it can be passed wherever an op or `Decoder::finish`
/// reads an input, and never as an output. It cannot outlive the borrow it was made from, and the
/// caller's memory cannot be written through it. The buffer is validated by every op like any
/// other: its dtype, its length and its owning device. [`BorrowedInput::is_lent`] says whether it
/// *is* the caller's memory (no copy) or a copy of it (a host slice on a device whose memory is
/// not the host's), freed on drop.
#[derive(Debug)]
pub struct BorrowedInput<'a> {
    buffer: Buffer,
    lent: bool,
    borrow: PhantomData<&'a [u8]>,
}

impl BorrowedInput<'_> {
    /// Wraps `buffer`, the caller's memory itself when `lent`, or a copy of it. For backends: the
    /// buffer's storage must stay valid without the borrow (a reference-counted handle, or an
    /// allocation the caller guarantees for `'a` through an `unsafe` constructor of the backend).
    pub fn new(buffer: Buffer, lent: bool) -> Self {
        BorrowedInput {
            buffer,
            lent,
            borrow: PhantomData,
        }
    }

    /// Whether the buffer is the caller's memory itself (no copy was made).
    pub fn is_lent(&self) -> bool {
        self.lent
    }
}

impl Deref for BorrowedInput<'_> {
    type Target = Buffer;

    fn deref(&self) -> &Buffer {
        &self.buffer
    }
}

/// A buffer is a buffer: APIs that take `&impl AsRef<Buffer>` take `&Buffer`, and
/// `&BorrowedInput` (or `&device.borrow_host(&rows)?`) alike.
impl AsRef<Buffer> for Buffer {
    fn as_ref(&self) -> &Buffer {
        self
    }
}

impl AsRef<Buffer> for BorrowedInput<'_> {
    fn as_ref(&self) -> &Buffer {
        &self.buffer
    }
}
