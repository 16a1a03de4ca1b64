//! What a backend implements: [`Backend`], whose methods receive arguments that the front
//! ([`Device`](crate::Device)) has already validated.
//!
//! A runner calls [`Device`](crate::Device); every type that implements [`Backend`] is a `Device`
//! through one blanket implementation, which validates the arguments, opens the op's tracing span
//! and applies the zero-row rule before it calls the backend. The argument types of the backend
//! methods ([`Call`], [`Alloc`], [`Upload`], [`Write`], [`Download`]) have private fields and no
//! public constructor: only that validation builds them, so a backend cannot be handed (or forget
//! to check) an unvalidated argument.

use std::fmt::Debug;

use std::sync::Arc;

use crate::ops::ProcessedSampleCall;
use crate::transfer::{DriverCounters, MemoryCounters, PendingDownload};
use crate::{Buffer, Capabilities, DType, DeviceId, DeviceInfo, Error, Op, Result};

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

macro_rules! any_call {
    ($($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        /// One validated call of any op: what [`Backend::run`] receives. One variant per op of the
        /// op table ([`for_each_op!`](crate::for_each_op)), holding that op's [`Call`].
        #[derive(Debug)]
        pub enum AnyCall<'c, 'o: 'c> {
            $(
                #[doc = concat!("`", stringify!($name), "` (`docs/semantics.md` §", $section, ").")]
                $variant(crate::ops::$name::OpCall<'c, 'o>),
            )*
        }

        impl AnyCall<'_, '_> {
            /// The op of this call.
            pub fn op(&self) -> Op {
                match self {
                    $(AnyCall::$variant(_) => Op::$variant,)*
                }
            }

            /// `(rows, width)` of the call ([`Call::extent`]).
            pub fn extent(&self) -> (usize, usize) {
                match self {
                    $(AnyCall::$variant(call) => call.extent(),)*
                }
            }

            /// Whether the call writes nothing ([`Call::launches_nothing`]).
            pub fn launches_nothing(&self) -> bool {
                match self {
                    $(AnyCall::$variant(call) => call.launches_nothing(),)*
                }
            }
        }
    };
}

crate::for_each_op!(any_call);

/// Dispatches an [`AnyCall`] to the backend's host file of its op: `ops::<op>::run(backend, call)`
/// for every op of the op table — the body of a backend's [`Backend::run`]. The calling module has
/// an `ops` module with one submodule per op, named as the op, each with
/// `fn run(backend: &B, call: OpCall<'_, '_>) -> Result<()>`: a backend missing an op's host file
/// does not compile.
///
/// ```ignore
/// fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
///     specula_backend_api::dispatch_ops!(self, call)
/// }
/// ```
#[macro_export]
macro_rules! dispatch_ops {
    ($backend:expr, $call:expr) => {
        $crate::__op_table! { [[$backend, $call]] $crate::__dispatch_ops }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __dispatch_ops {
    ([$backend:expr, $call:expr] $($variant:ident $name:ident $section:literal $exact:ident $summary:literal,)*) => {
        match $call {
            $($crate::backend::AnyCall::$variant(call) => ops::$name::run($backend, call),)*
        }
    };
}

/// The operations a backend implements, each on arguments that are already validated.
///
/// Implement this trait (not [`Device`](crate::Device)): every `Backend` is a `Device`, whose
/// methods — the validating front — check the arguments, open the tracing span and apply the
/// zero-row rule once for every backend, then call [`Backend::run`] with the op's validated
/// [`Call`]. A backend keeps one host file per op (`ops/<op>.rs`, beside its kernel file of the
/// same name) and dispatches to them with [`dispatch_ops!`](crate::dispatch_ops).
///
/// [`Backend::run`] is only called when the op has something to do (see each op's call type for
/// its zero-row rule).
pub trait Backend: Send + Sync + Debug {
    /// The device's id, description and capabilities.
    fn desc(&self) -> &DeviceDesc;

    /// Allocates zeroed memory.
    fn run_alloc_zeroed(&self, alloc: Alloc) -> Result<Buffer>;
    /// Allocates a buffer holding the upload's bytes. Blocks until copied.
    fn run_upload(&self, upload: Upload<'_>) -> Result<Buffer>;
    /// Overwrites a window. Blocks until copied.
    fn run_write(&self, write: Write<'_, '_>) -> Result<()>;
    /// Copies a window to the host. Blocks until the device has finished writing it.
    fn run_download(&self, download: Download<'_>) -> Result<Vec<u8>>;
    /// Waits for every enqueued op; reports execution faults.
    fn run_synchronize(&self) -> Result<()>;

    /// Whether this device's buffers are host memory ([`host::HostMemory`](crate::host)): then
    /// [`DeviceExt::borrow_host`](crate::DeviceExt::borrow_host) lends the caller's slice to it
    /// without a copy. The default is `false` (the slice is uploaded); the CPU backend and the
    /// reference device say `true`.
    fn host_memory(&self) -> bool {
        false
    }

    /// Starts copying several windows to the host behind every enqueued op, returning without
    /// waiting when the backend can; [`PendingDownload::wait`] then waits once for all of them.
    ///
    /// The default copies each window at once with [`Backend::run_download`] and returns
    /// [`PendingDownload::ready`] (right for a host backend, whose ops have already run). A
    /// device backend overrides it with its asynchronous copies: one staging buffer and one map
    /// (wgpu), non-blocking reads and one wait (OpenCL), copies on the stream and one
    /// synchronisation (CUDA).
    fn run_start_download(&self, downloads: &[Download<'_>]) -> Result<PendingDownload> {
        downloads
            .iter()
            .map(|&d| self.run_download(d))
            .collect::<Result<Vec<_>>>()
            .map(PendingDownload::ready)
    }

    /// Overwrites several windows, in order, as one batched write. The default calls
    /// [`Backend::run_write`] for each; a backend that can enqueue its writes and wait once
    /// overrides it.
    fn run_write_many(&self, writes: Vec<Write<'_, '_>>) -> Result<()> {
        writes.into_iter().try_for_each(|w| self.run_write(w))
    }

    /// Runs one validated op call (usually `dispatch_ops!(self, call)`).
    fn run(&self, call: AnyCall<'_, '_>) -> Result<()>;

    /// Runs a validated fused `top_k_top_p_sample` of processed rows: only called on a device
    /// whose [`Capabilities::fused_processing`](crate::Capabilities::fused_processing) is set
    /// (the front composes the two ops otherwise). The default reports the op unsupported.
    fn run_processed_sample(&self, call: ProcessedSampleCall<'_>) -> Result<()> {
        let _ = call;
        Err(Error::Unsupported {
            backend: self.desc().info.kind,
            op: Op::TopKTopPSample,
            what: "fused logits processing".to_owned(),
        })
    }

    /// Builds every kernel, pipeline or program the backend would otherwise build lazily at the
    /// first call that needs it, for the ops and score dtypes of `plan` (already narrowed to what
    /// this device runs and supports, [`WarmUp::for_device`](crate::WarmUp::for_device)).
    /// Idempotent: what is built is cached and not built again. A kernel that fails to build is
    /// [`Error::KernelBuild`], naming the op's kernel.
    ///
    /// The default builds nothing (a backend without compiled kernels: the CPU backend, the
    /// reference device).
    fn run_warm_up(&self, plan: &crate::WarmUp) -> Result<()> {
        let _ = plan;
        Ok(())
    }
}
