//! The validated arguments a backend receives: the device description ([`DeviceDesc`]), one op
//! call ([`Call`]) and the memory operations ([`Alloc`], [`Upload`], [`Write`], [`Download`]).
//!
//! Their fields are private and only `backend-api` builds them, after validation (the front,
//! [`Device`](crate::Device)). The module depends on no op: the ops' validation (`ops/<op>.rs`)
//! builds these types, and [`Backend`](crate::Backend) receives them (re-exported from
//! [`backend`](crate::backend)).

use std::sync::Arc;

use crate::transfer::{DriverCounters, MemoryCounters};
use crate::{Buffer, Capabilities, DType, DeviceId, DeviceInfo, Error, Result};

/// What an opened device is: its id (carried by every buffer it allocates), its description and
/// its capabilities. A backend builds it once when the device is opened.
#[derive(Clone, Debug)]
pub struct DeviceDesc {
    /// The id every buffer of this device carries.
    pub id: DeviceId,
    /// What the device is.
    pub info: DeviceInfo,
    /// What it supports.
    pub capabilities: Capabilities,
    /// The device's memory-operation counters ([`Device::memory_stats`](crate::Device::memory_stats)).
    counters: Arc<MemoryCounters>,
    /// The backend's driver-call counters, when it counts them ([`MemoryStats::driver`](crate::MemoryStats::driver)).
    driver: Option<Arc<DriverCounters>>,
}

impl DeviceDesc {
    /// A description with a fresh, process-unique [`DeviceId`].
    pub fn new(info: DeviceInfo, capabilities: Capabilities) -> Self {
        DeviceDesc {
            id: DeviceId::next(),
            info,
            capabilities,
            counters: Arc::default(),
            driver: None,
        }
    }

    /// This description, for a backend that counts its driver calls: [`Device::memory_stats`]
    /// then reports them ([`MemoryStats::driver`](crate::MemoryStats::driver)), as the backend
    /// records them through [`DeviceDesc::driver_counters`].
    ///
    /// [`Device::memory_stats`]: crate::Device::memory_stats
    pub fn counting_driver_calls(mut self) -> Self {
        self.driver = Some(Arc::default());
        self
    }

    /// The driver-call counters a backend records into (`None` unless the description was made
    /// [`counting_driver_calls`](DeviceDesc::counting_driver_calls)).
    pub fn driver_counters(&self) -> Option<&Arc<DriverCounters>> {
        self.driver.as_ref()
    }

    /// The counters the front updates.
    pub(crate) fn counters(&self) -> &Arc<MemoryCounters> {
        &self.counters
    }
}

/// A validated call of one op: the arguments as the caller passed them, plus what validation
/// derived from them (`facts`: the float dtype, the output-row count, ...).
///
/// Only `backend-api` builds a `Call`, after validation: a backend method that receives one knows
/// that every buffer has the right dtype, length and owning device, and every host-side value is
/// in range. Buffer *contents* are still untrusted (the device fallbacks of `docs/semantics.md`).
#[derive(Debug)]
pub struct Call<'c, I, O: ?Sized, P, F> {
    inputs: I,
    out: &'c mut O,
    params: P,
    facts: F,
    extent: (usize, usize),
    launches_nothing: bool,
}

impl<'c, I, O: ?Sized, P, F> Call<'c, I, O, P, F> {
    pub(crate) fn new(inputs: I, out: &'c mut O, params: P, facts: F) -> Self {
        Call {
            inputs,
            out,
            params,
            facts,
            extent: (0, 0),
            launches_nothing: false,
        }
    }

    /// Records the call's extent for its tracing span: output rows (or slots) and the row width
    /// (vocabulary, hidden size; 0 where the op has none).
    pub(crate) fn with_extent(mut self, rows: usize, width: usize) -> Self {
        self.extent = (rows, width);
        self
    }

    /// Records the op's zero-row rule: when `nothing` holds, the call writes nothing and no backend
    /// is called.
    pub(crate) fn launching_nothing_if(mut self, nothing: bool) -> Self {
        self.launches_nothing = nothing;
        self
    }

    /// `(rows, width)` of the call, as its span reports them.
    pub fn extent(&self) -> (usize, usize) {
        self.extent
    }

    /// Whether the call writes nothing (the front then calls no backend).
    pub fn launches_nothing(&self) -> bool {
        self.launches_nothing
    }

    /// The input buffers.
    pub fn inputs(&self) -> &I {
        &self.inputs
    }

    /// The op's parameters.
    pub fn params(&self) -> &P {
        &self.params
    }

    /// What validation derived (see each op's call type).
    pub fn facts(&self) -> &F {
        &self.facts
    }

    /// The output buffers.
    pub fn out(&mut self) -> &mut O {
        self.out
    }

    /// The output buffers, giving up the call (to build another call from a validated one).
    pub(crate) fn into_out(self) -> &'c mut O {
        self.out
    }

    /// Inputs, outputs, parameters and facts at once (the outputs mutably).
    pub fn parts(&mut self) -> (&I, &mut O, &P, &F) {
        (&self.inputs, self.out, &self.params, &self.facts)
    }
}

/// A validated allocation: `len` elements of `dtype`, `bytes` in all (no overflow, within the
/// device's largest buffer).
#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    dtype: DType,
    len: usize,
    bytes: usize,
}

impl Alloc {
    pub(crate) fn new(dtype: DType, len: usize, bytes: usize) -> Self {
        Alloc { dtype, len, bytes }
    }

    /// An allocation of `len` elements of `dtype` on the device `desc`, or
    /// [`Error::OutOfMemory`] when its size overflows or exceeds the device's largest buffer.
    pub(crate) fn checked(desc: &DeviceDesc, dtype: DType, len: usize) -> Result<Self> {
        let out_of_memory = |requested_bytes| Error::OutOfMemory {
            backend: desc.info.kind,
            requested_bytes,
        };
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or(out_of_memory(usize::MAX))?;
        match desc.capabilities.max_buffer_bytes {
            Some(max) if bytes as u64 > max => Err(out_of_memory(bytes)),
            _ => Ok(Alloc::new(dtype, len, bytes)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no element is asked for.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes (`len · dtype.size_bytes()`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A validated upload: a new buffer of [`Upload::alloc`] holding exactly `bytes`.
#[derive(Clone, Copy, Debug)]
pub struct Upload<'b> {
    alloc: Alloc,
    bytes: &'b [u8],
}

impl<'b> Upload<'b> {
    pub(crate) fn new(alloc: Alloc, bytes: &'b [u8]) -> Self {
        Upload { alloc, bytes }
    }

    /// The buffer to allocate.
    pub fn alloc(&self) -> Alloc {
        self.alloc
    }

    /// Its contents (exactly `alloc().bytes()` bytes).
    pub fn bytes(&self) -> &'b [u8] {
        self.bytes
    }
}

/// A validated write: `bytes` is exactly the size of `dst`'s window, and `dst` belongs to this
/// device.
#[derive(Debug)]
pub struct Write<'c, 'b> {
    dst: &'c mut Buffer,
    bytes: &'b [u8],
}

impl<'c, 'b> Write<'c, 'b> {
    pub(crate) fn new(dst: &'c mut Buffer, bytes: &'b [u8]) -> Self {
        Write { dst, bytes }
    }

    /// The destination and the bytes for its window.
    pub fn parts(&mut self) -> (&mut Buffer, &'b [u8]) {
        (self.dst, self.bytes)
    }
}

/// A validated download of `src`'s window (`src` belongs to this device).
#[derive(Clone, Copy, Debug)]
pub struct Download<'c> {
    src: &'c Buffer,
}

impl<'c> Download<'c> {
    pub(crate) fn new(src: &'c Buffer) -> Self {
        Download { src }
    }

    /// The buffer whose window is read.
    pub fn src(&self) -> &'c Buffer {
        self.src
    }
}
