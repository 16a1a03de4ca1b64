//! The one place this backend asks the CUDA driver to allocate, copy, wait or launch.
//!
//! Every such call goes through a [`Driver`] method, which counts it in the device's
//! [`DriverCounters`] ([`Device::memory_stats`](specula_backend_api::Device::memory_stats)'s
//! `driver`), so a test can assert what an op costs the driver: after its warm-up, an op makes
//! its launches and nothing else. `tests::driver_calls_are_made_here_only` checks that no other
//! file of the crate makes one of these calls.
//!
//! While a step is being captured ([`crate::CapturedStep`]) the stream records instead of
//! running, so a call that would allocate, copy or wait is refused here with a typed error
//! ([`CudaError::NotCapturable`]) before it reaches the driver: such a call cannot be replayed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdeviceptr, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    DriverError, PinnedHostSlice,
};
use specula_backend_api::transfer::DriverCounters;

use crate::error::CudaError;

/// A context, the one stream every op of a device is enqueued on, and the counters of the
/// driver calls made on it.
pub(crate) struct Driver {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    counters: Arc<DriverCounters>,
    /// A step is being captured on the stream.
    capturing: AtomicBool,
}

/// Device memory and its address, read once when it was allocated (no driver call later).
pub(crate) struct DeviceBlock {
    /// Owns the memory (freed, stream-ordered, on drop).
    _slice: CudaSlice<u8>,
    ptr: CUdeviceptr,
}

impl DeviceBlock {
    /// The address of the first byte.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
}

/// Page-locked host memory and its address, read once when it was allocated.
pub(crate) struct PinnedBlock {
    /// Owns the memory (freed on drop).
    _slice: PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the block is plain host memory owned by `_slice` (itself Send + Sync); `ptr` is its
// address, and every access through it is ordered by the caller (the download's event).
unsafe impl Send for PinnedBlock {}
// SAFETY: as above; `&PinnedBlock` only exposes the address and the length.
unsafe impl Sync for PinnedBlock {}

impl PinnedBlock {
    /// The address of the first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// The page-locked block a device keeps between downloads (`None` until the first, or while it
/// is in flight).
pub(crate) type PinnedPool = Arc<Mutex<Option<PinnedBlock>>>;

impl Driver {
    /// The driver of `stream` (of context `ctx`), counting into `counters`.
    pub(crate) fn new(
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        counters: Arc<DriverCounters>,
    ) -> Self {
        Driver {
            ctx,
            stream,
            counters,
            capturing: AtomicBool::new(false),
        }
    }

    /// The counters of this driver's calls.
    pub(crate) fn counters(&self) -> &Arc<DriverCounters> {
        &self.counters
    }

    /// Whether a step is being captured.
    pub(crate) fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// Refuses `what` while a step is being captured.
    fn not_while_capturing(&self, what: &'static str) -> Result<(), CudaError> {
        if self.is_capturing() {
            return Err(CudaError::NotCapturable { what });
        }
        Ok(())
    }

    /// `bytes` of zeroed device memory, stream-ordered (one allocation).
    pub(crate) fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBlock, CudaError> {
        self.not_while_capturing("an allocation")?;
        let slice = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| CudaError::driver("cuMemAllocAsync", e))?;
        self.counters.allocated();
        // With event tracking off (a context this device made, one stream) the guard records
        // nothing; on a runner's context it orders later reads after the zeroing.
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(DeviceBlock { _slice: slice, ptr })
    }

    /// `bytes` of device memory whose contents are whatever was there (one allocation): scratch
    /// that every kernel writes before it reads ([`crate::arena`]).
    pub(crate) fn alloc_uninit(&self, bytes: usize) -> Result<DeviceBlock, CudaError> {
        self.not_while_capturing("an allocation")?;
        // SAFETY: the bytes are uninitialised device memory; no host code reads them, and every
        // kernel given this scratch writes each word before reading it.
        let slice = unsafe { self.stream.alloc::<u8>(bytes) }
            .map_err(|e| CudaError::driver("cuMemAllocAsync", e))?;
        self.counters.allocated();
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(DeviceBlock { _slice: slice, ptr })
    }

    /// `bytes` of page-locked, cacheable host memory (one allocation).
    pub(crate) fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBlock, CudaError> {
        self.not_while_capturing("a page-locked allocation")?;
        // SAFETY: the block's bytes are uninitialised; every byte that is read back is written
        // by a copy first (`crate::download`). Flags 0: cacheable memory, since the host reads it
        // (write-combined memory reads slowly).
        let mut slice = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }
            .map_err(|e| CudaError::driver("cuMemHostAlloc", e))?;
        self.counters.allocated();
        // The slice's own event was never recorded: this returns at once.
        let ptr = slice
            .as_mut_ptr()
            .map_err(|e| CudaError::driver("cuEventSynchronize", e))?;
        Ok(PinnedBlock {
            _slice: slice,
            ptr,
            len: bytes,
        })
    }

    /// Waits until the stream has run everything enqueued on it (one synchronisation).
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        self.not_while_capturing("a synchronisation")?;
        self.counters.synchronized();
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
    }

    /// Waits for `event` (one synchronisation counted in `counters`: a download's wait holds the
    /// counters, not the device).
    pub(crate) fn wait_event(
        counters: &DriverCounters,
        event: &CudaEvent,
    ) -> Result<(), CudaError> {
        counters.synchronized();
        event
            .synchronize()
            .map_err(|e| CudaError::driver("cuEventSynchronize", e))
    }

    /// Waits for `end` (one synchronisation) and returns the milliseconds from `start` to `end`
    /// (both recorded on this context's stream, created with timing).
    pub(crate) fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32, CudaError> {
        Driver::wait_event(&self.counters, end)?;
        // SAFETY: both events belong to this context and were recorded; `end` has completed.
        unsafe { cudarc::driver::result::event::elapsed(start.cu_event(), end.cu_event()) }
            .map_err(|e| CudaError::driver("cuEventElapsedTime", e))
    }

    /// A new event on this context, with timing when `timing` (else the cheaper default).
    pub(crate) fn new_event(&self, timing: bool) -> Result<CudaEvent, CudaError> {
        let flags = timing.then_some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        self.ctx
            .new_event(flags)
            .map_err(|e| CudaError::driver("cuEventCreate", e))
    }

    /// Records `event` behind everything enqueued on the stream so far.
    pub(crate) fn record(&self, event: &CudaEvent) -> Result<(), CudaError> {
        event
            .record(&self.stream)
            .map_err(|e| CudaError::driver("cuEventRecord", e))
    }

    /// Enqueues the copy of `src` to device address `dst` (one copy). From pageable host memory
    /// the driver stages `src` before it returns (CUDA's API synchronization behavior: "the
    /// function will return once the pageable buffer has been copied to the staging memory"), so
    /// `src` may be reused at once and no synchronisation is needed; later work on the stream
    /// reads the copied bytes in order.
    pub(crate) fn copy_to_device(&self, src: &[u8], dst: CUdeviceptr) -> Result<(), CudaError> {
        self.not_while_capturing("a host-to-device copy")?;
        self.bind()?;
        // SAFETY: `dst` is the address of a window of `src.len()` bytes of this context's memory
        // (the caller's validated buffer), bound above; `src` is read before this returns (above).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("cuMemcpyHtoDAsync", e))?;
        self.counters.copied();
        Ok(())
    }

    /// Enqueues the copy of `out.len()` bytes at device address `src` into `out` (one copy).
    ///
    /// # Safety
    ///
    /// `src` must be valid for `out.len()` bytes in this context, and `out` must stay alive and
    /// unread until the stream has run the copy (the caller synchronises, or waits for an event
    /// recorded behind it). Into pageable memory the driver returns only once the copy is done.
    pub(crate) unsafe fn copy_to_host(
        &self,
        src: CUdeviceptr,
        out: &mut [u8],
    ) -> Result<(), CudaError> {
        self.not_while_capturing("a device-to-host copy")?;
        self.bind()?;
        // SAFETY: the caller's contract above.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(out, src, self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("cuMemcpyDtoHAsync", e))?;
        self.counters.copied();
        Ok(())
    }

    /// Launches `f` over `grid` blocks of `block` threads with the one argument block `args`,
    /// cooperatively or not (one launch): no allocation, no event, no argument vector.
    ///
    /// # Safety
    ///
    /// `args` must be the argument struct `f` was compiled with, every pointer in it valid for
    /// what the kernel reads and writes until the stream has run the kernel.
    pub(crate) unsafe fn launch<A: DeviceRepr>(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &A,
        cooperative: bool,
    ) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // The kernel's one parameter: the address of the argument block (copied by the driver
        // when the launch is enqueued).
        let mut params = [args as *const A as *mut std::ffi::c_void];
        let (f, stream) = (f.cu_function(), self.stream.cu_stream());
        // SAFETY: the caller's contract above; `params` outlives the call.
        unsafe {
            if cooperative {
                cudarc::driver::result::launch_cooperative_kernel(
                    f,
                    grid,
                    (block, 1, 1),
                    0,
                    stream,
                    &mut params,
                )
            } else {
                cudarc::driver::result::launch_kernel(
                    f,
                    grid,
                    (block, 1, 1),
                    0,
                    stream,
                    &mut params,
                )
            }
        }?;
        self.counters.launched();
        Ok(())
    }

    /// Starts recording the stream instead of running it; until [`Driver::end_capture`], the
    /// calls above that cannot be replayed are refused.
    pub(crate) fn begin_capture(&self) -> Result<(), CudaError> {
        if self.capturing.swap(true, Ordering::AcqRel) {
            return Err(CudaError::NotCapturable {
                what: "a capture inside a capture",
            });
        }
        // Thread-local mode: only this thread's unsafe calls would invalidate the capture (this
        // crate refuses its own above); other threads of the runner are left alone.
        let begun = self
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        if let Err(e) = begun {
            self.capturing.store(false, Ordering::Release);
            return Err(CudaError::driver("cuStreamBeginCapture", e));
        }
        Ok(())
    }

    /// Ends the capture and instantiates what was recorded (`None`: nothing was).
    pub(crate) fn end_capture(&self) -> Result<Option<CudaGraph>, CudaError> {
        let ended = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        self.capturing.store(false, Ordering::Release);
        ended.map_err(|e| CudaError::driver("cuStreamEndCapture", e))
    }

    /// Enqueues a captured graph on the stream (one launch).
    pub(crate) fn launch_graph(&self, graph: &CudaGraph) -> Result<(), CudaError> {
        self.not_while_capturing("a captured step's replay")?;
        graph
            .launch()
            .map_err(|e| CudaError::driver("cuGraphLaunch", e))?;
        self.counters.launched();
        Ok(())
    }

    /// Makes the context current on this thread (raw driver calls need it).
    fn bind(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The spellings of the driver calls that allocate, copy, wait or launch.
    const DRIVER_CALLS: &[&str] = &[
        "alloc_zeros",
        "alloc_pinned",
        "stream.alloc",
        "malloc",
        "memcpy_",
        "memset",
        "launch_builder",
        "launch_kernel",
        "launch_cooperative_kernel",
        "stream.synchronize",
        "event.synchronize",
        "ctx.synchronize",
        "begin_capture(",
        "end_capture(",
        "graph.launch",
        "event::elapsed",
    ];

    /// The `Driver` methods named like the driver calls they make.
    const DRIVER_METHODS: &[&str] = &["alloc_pinned", "begin_capture(", "end_capture("];

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src/ is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn driver_calls_are_made_here_only() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        assert!(files.len() > 10, "found {} files", files.len());
        let mut found = Vec::new();
        for file in files {
            let name = file
                .strip_prefix(&src)
                .unwrap_or(&file)
                .display()
                .to_string();
            // This file, and the binary that only compiles (it has no device).
            if name == "driver.rs" || name.starts_with("bin") {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("readable source");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for call in DRIVER_CALLS {
                    // A call of a `Driver` method of the same name (`self.driver.alloc_pinned`)
                    // is counted; `driver.stream.synchronize()` is not.
                    let method = DRIVER_METHODS.contains(call);
                    let uncounted = code
                        .match_indices(call)
                        .any(|(at, _)| !(method && code[..at].ends_with("driver.")));
                    if uncounted {
                        found.push(format!("{name}:{}: {call}", n + 1));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "driver calls outside driver.rs (not counted):\n{}",
            found.join("\n")
        );
    }
}
