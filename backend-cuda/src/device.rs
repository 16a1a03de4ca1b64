//! `CudaDevice`: probing, the kernel cache, launches, and the [`Backend`] implementation (memory
//! here, each op in `ops/<op>.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use specula_backend_api::backend::{Alloc, AnyCall, Backend, DeviceDesc, Download, Upload, Write};
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, DeviceInfo, Error, Op, PendingDownload, Result, WarmUp,
};

use crate::arena::{Allocate, Arena};
use crate::args::CudaArgs;
use crate::driver::{DeviceBlock, Driver, PinnedPool};
use crate::error::CudaError;
use crate::kernels::{
    Instance, KernelFile, compile_options, function_slot, function_slots, warm_up_plan,
};
use crate::storage::{self, CudaStorage};
use crate::{launch, nvrtc, ops};

/// The oldest driver API this build's bindings (`cuda-12080`) are used with.
const MIN_DRIVER_VERSION: i32 = 12_000;
/// The kernels use `__nanosleep` and independent thread scheduling: compute capability 7.0+.
const MIN_COMPUTE_CAPABILITY: i32 = 70;

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BackendKind::Cuda,
        reason: reason.into(),
    }
}

/// The versions [`CudaDevice::probe`] found: the driver's (`12080` for 12.8) and NVRTC's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Versions {
    driver: i32,
    nvrtc: (i32, i32),
}

/// Serialises the devices' kernel builds within the process. Two devices compiling at the same
/// time (two threads, NVRTC 13.0.88 and driver 580 on an H200, 2026-11-29) kept both threads at
/// 100 % CPU inside NVRTC for over 50 s without an end, the GPU idle; one build at a time finishes
/// in seconds. A runner that opens a device per worker thread, or a test harness that opens one
/// per test (`tests/driver_counts.rs`), builds through here. (`nvrtc-check` compiles in parallel
/// with the CUDA 12.9 wheel's NVRTC, which does not show it.)
static BUILDING: Mutex<()> = Mutex::new(());

/// Holds [`BUILDING`] while a device compiles and loads a program.
pub(crate) fn one_build_at_a_time() -> MutexGuard<'static, ()> {
    BUILDING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The scratch of a device's ops: the arena ([`crate::arena`]) and the grid-barrier words of
/// split rows.
#[derive(Default)]
pub(crate) struct Scratch {
    arena: Arena<DeviceBlock>,
    /// [`launch::SPLIT_MAX_ROWS`] × [`launch::GRID_SYNC_BYTES`], zeroed once when allocated and
    /// from then on only written by the split sampling kernel, whose barrier protocol keeps them
    /// valid from one launch to the next (`select.cuh`, `row_part_split`).
    grid_sync: Option<Arc<DeviceBlock>>,
}

impl Scratch {
    /// The blocks a captured step's kernels read: kept alive for as long as it can replay.
    pub(crate) fn blocks(&self) -> Vec<Arc<DeviceBlock>> {
        self.arena
            .block()
            .into_iter()
            .chain(self.grid_sync.clone())
            .collect()
    }
}

impl Allocate for Driver {
    type Block = DeviceBlock;
    type Error = CudaError;
    fn allocate(&self, bytes: usize) -> std::result::Result<DeviceBlock, CudaError> {
        self.alloc_uninit(bytes)
    }
    fn address(block: &DeviceBlock) -> u64 {
        block.ptr()
    }
}

/// One op's scratch: the address of at least the bytes it asked for, and the arena held (so no
/// other op enqueues kernels on the same bytes before this op's kernels are enqueued).
pub(crate) struct ScratchGuard<'d> {
    device: &'d CudaDevice,
    scratch: MutexGuard<'d, Scratch>,
    ptr: u64,
}

impl ScratchGuard<'_> {
    /// The scratch's device address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The address of the grid-barrier words of split rows (allocated, zeroed, at first use).
    pub(crate) fn grid_sync(&mut self, op: Op) -> Result<u64> {
        if let Some(block) = &self.scratch.grid_sync {
            return Ok(block.ptr());
        }
        let bytes = launch::SPLIT_MAX_ROWS * launch::GRID_SYNC_BYTES as usize;
        let block = self
            .device
            .driver
            .alloc_zeroed(bytes)
            .map_err(|e| self.device.api_error(e, op))?;
        let ptr = block.ptr();
        self.scratch.grid_sync = Some(Arc::new(block));
        Ok(ptr)
    }
}

/// One NVIDIA GPU: a context, one stream every op is enqueued on, and the kernels built for the
/// device's architecture (compiled by NVRTC at first use, cached per file and element types).
///
/// Per op, the host path makes no driver call but its launches: its scratch comes from a
/// per-device arena (grown on demand, reused), its function from a table filled once per entry point,
/// its small parameters travel inside the kernel's one argument struct, and only a download (or
/// [`Device::synchronize`](specula_backend_api::Device::synchronize)) waits for the device.
/// [`Device::memory_stats`](specula_backend_api::Device::memory_stats) counts the driver calls
/// (`driver`: allocations, synchronisations, copies, launches). A decoder step whose shapes
/// repeat can be recorded once and replayed as one CUDA graph ([`CudaDevice::capture_step`]).
pub struct CudaDevice {
    desc: DeviceDesc,
    pub(crate) driver: Driver,
    target: String,
    pub(crate) multiprocessors: u32,
    pub(crate) cooperative: bool,
    /// The modules built so far (a function keeps its own module alive; this lets the other
    /// entry points of a built module be looked up without compiling it again).
    modules: Mutex<HashMap<(KernelFile, Instance), Arc<CudaModule>>>,
    /// Every entry point of every file and instance, looked up once ([`function_slot`]).
    functions: Box<[OnceLock<CudaFunction>]>,
    pub(crate) scratch: Mutex<Scratch>,
    /// The page-locked block downloads reuse ([`crate::download`]).
    pub(crate) pinned: PinnedPool,
    /// The read-floor kernel of the benchmarks ([`CudaDevice::read_floor`]), loaded at first use.
    pub(crate) floor: OnceLock<crate::timing::FloorKernel>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("desc", &self.desc)
            .field("target", &self.target)
            .field("multiprocessors", &self.multiprocessors)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Enqueues the copy of a download's window to a new host vector on the stream (into pageable
    /// memory the copy is done when the call returns).
    fn copy_to_host(&self, download: Download<'_>) -> Result<Vec<u8>> {
        let src = download.src();
        let (start, end) = storage::window_bytes(src);
        let mut out = vec![0u8; end - start];
        if out.is_empty() {
            return Ok(out);
        }
        let ptr = storage::window_ptr(src).map_err(|e| e.into_api("download"))?;
        // SAFETY: `ptr` is the validated window of a buffer of this device (or a wrapped pointer,
        // valid for its length by `wrap_device_ptr`'s contract), `out` is exactly its size, and
        // the caller synchronises before reading `out`.
        unsafe { self.driver.copy_to_host(ptr, &mut out) }
            .map_err(|e| self.api_error_for(e, Op::Memory, "download"))?;
        Ok(out)
    }

    /// The API error of a failed driver call of `op` (a refused call while capturing is
    /// [`Error::Unsupported`]).
    pub(crate) fn api_error(&self, error: CudaError, op: Op) -> Error {
        self.api_error_for(error, op, op.name())
    }

    /// [`CudaDevice::api_error`], naming what failed (`download`, `upload`, ...) for an
    /// execution error.
    pub(crate) fn api_error_for(&self, error: CudaError, op: Op, what: &str) -> Error {
        match error {
            CudaError::NotCapturable { what } => Error::Unsupported {
                backend: BackendKind::Cuda,
                op,
                what: format!(
                    "{what} while a step is captured (run the step once before capturing it, so that \
                     its kernels and scratch are ready; a captured step launches kernels only)"
                ),
            },
            other => other.into_api(what),
        }
    }

    /// Opens device `ordinal`. Every missing piece is reported as [`Error::Unavailable`] with the
    /// reason, never a panic: libcuda and libnvrtc are probed before cudarc touches them (its
    /// loaders panic when a library is absent).
    pub fn new(ordinal: usize) -> Result<Self> {
        let versions = Self::probe()?;
        let count = cudarc::driver::result::device::get_count()
            .map_err(|e| unavailable(format!("cannot count CUDA devices: {e}")))?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(unavailable(format!(
                "no CUDA device {ordinal} ({count} found)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            unavailable(format!("cannot create a context on device {ordinal}: {e}"))
        })?;
        // One stream carries every op, so cudarc's cross-stream event tracking is not needed.
        // SAFETY: no buffer has been allocated in this context by this device yet, and all later
        // work of this device runs on the one stream created below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| unavailable(format!("cannot create a stream: {e}")))?;
        Self::on_stream(ctx, stream, versions)
    }

    /// Checks that libcuda, a recent enough driver and NVRTC are there, and initialises the
    /// driver: the driver's and NVRTC's versions.
    pub(crate) fn probe() -> Result<Versions> {
        // SAFETY: only tries to open the library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(unavailable(
                "libcuda not found (no NVIDIA driver on this machine)",
            ));
        }
        let mut driver_version = 0;
        // SAFETY: libcuda is present; cuDriverGetVersion needs no initialisation.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| unavailable(format!("cuDriverGetVersion failed: {e}")))?;
        if driver_version < MIN_DRIVER_VERSION {
            return Err(unavailable(format!(
                "the NVIDIA driver supports CUDA {}.{}, this backend needs 12.0 or newer",
                driver_version / 1000,
                driver_version % 1000 / 10
            )));
        }
        let nvrtc_version = nvrtc::probe().map_err(unavailable)?;
        cudarc::driver::result::init().map_err(|e| unavailable(format!("cuInit failed: {e}")))?;
        Ok(Versions {
            driver: driver_version,
            nvrtc: nvrtc_version,
        })
    }

    /// The device on `stream` of context `ctx`: checks the compute capability, picks the NVRTC
    /// target and reads what the launches need.
    pub(crate) fn on_stream(
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        versions: Versions,
    ) -> Result<Self> {
        let ordinal = ctx.ordinal();
        let (driver_version, nvrtc_version) = (versions.driver, versions.nvrtc);
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| unavailable(format!("cannot read the compute capability: {e}")))?;
        let cc = major * 10 + minor;
        if cc < MIN_COMPUTE_CAPABILITY {
            return Err(unavailable(format!(
                "compute capability {major}.{minor}; the kernels need 7.0 or newer (Volta)"
            )));
        }
        let archs = nvrtc::supported_archs().map_err(|e| unavailable(e.to_string()))?;
        let target = nvrtc::target_for(cc, &archs).ok_or_else(|| {
            unavailable(format!(
                "NVRTC {}.{} cannot generate code for compute capability {major}.{minor}",
                nvrtc_version.0, nvrtc_version.1
            ))
        })?;
        let name = ctx
            .name()
            .unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let attribute = |a: CUdevice_attribute| ctx.attribute(a).unwrap_or(0);
        let multiprocessors = u32::try_from(attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        ))
        .unwrap_or(1)
        .max(1);
        let cooperative =
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) != 0;
        let total_mem = ctx.total_mem().ok().map(|b| b as u64);
        let info = DeviceInfo {
            kind: BackendKind::Cuda,
            ordinal,
            name,
            driver: format!(
                "CUDA driver {}.{}, NVRTC {}.{}, compute capability {major}.{minor}, kernels for {target}",
                driver_version / 1000,
                driver_version % 1000 / 10,
                nvrtc_version.0,
                nvrtc_version.1
            ),
        };
        let capabilities = Capabilities {
            max_buffer_bytes: total_mem,
            ..Capabilities::every_op()
        };
        let desc = DeviceDesc::new(info, capabilities).counting_driver_calls();
        let counters = desc.driver_counters().cloned().unwrap_or_default();
        Ok(CudaDevice {
            desc,
            driver: Driver::new(ctx, stream, counters),
            target,
            multiprocessors,
            cooperative,
            modules: Mutex::new(HashMap::new()),
            functions: (0..function_slots()).map(|_| OnceLock::new()).collect(),
            scratch: Mutex::new(Scratch::default()),
            pinned: PinnedPool::default(),
            floor: OnceLock::new(),
        })
    }

    /// The architecture kernels are built for (`sm_90`, or `compute_XY` for a newer device).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The function `stem` of `file` built for `instance`: from the device's table, or, at its
    /// first use, compiled and loaded (an NVRTC error is [`Error::KernelBuild`] with the log).
    fn function(
        &self,
        file: KernelFile,
        instance: Instance,
        stem: &'static str,
    ) -> Result<&CudaFunction> {
        let slot = function_slot(file, instance, stem)
            .and_then(|slot| self.functions.get(slot))
            .ok_or_else(|| CudaError::UnknownKernel { stem }.into_api(file.op().name()))?;
        match slot.get() {
            Some(f) => Ok(f),
            None => self.load_function(slot, file, instance, stem),
        }
    }

    /// Loads `stem` of `file` for `instance` into `slot`, building the module at first use.
    fn load_function<'a>(
        &self,
        slot: &'a OnceLock<CudaFunction>,
        file: KernelFile,
        instance: Instance,
        stem: &'static str,
    ) -> Result<&'a CudaFunction> {
        let op = file.op();
        if self.driver.is_capturing() {
            let error = CudaError::NotCapturable {
                what: "building a kernel",
            };
            return Err(self.api_error(error, op));
        }
        let module = {
            let mut modules = self
                .modules
                .lock()
                .map_err(|_| CudaError::Poisoned.into_api(op.name()))?;
            match modules.entry((file, instance)) {
                std::collections::hash_map::Entry::Occupied(o) => o.get().clone(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(self.build_module(file, instance)?).clone()
                }
            }
        };
        let f = module
            .load_function(&instance.entry(stem))
            .map_err(|e| CudaError::driver("cuModuleGetFunction", e).into_api(op.name()))?;
        // Another thread may have filled the slot meanwhile: both functions are the same entry.
        Ok(slot.get_or_init(|| f))
    }

    /// Compiles `file` for `instance` with NVRTC and loads it into the context, one build at a
    /// time in the process ([`BUILDING`]).
    fn build_module(&self, file: KernelFile, instance: Instance) -> Result<Arc<CudaModule>> {
        let _one_at_a_time = one_build_at_a_time();
        let _span = tracing::debug_span!(
            "nvrtc",
            backend = "cuda",
            file = %file.file_name(),
            dtype = instance.suffix.name(),
            target = %self.target
        )
        .entered();
        let kernel = format!(
            "{} [{}/{}] for {}",
            file.file_name(),
            instance.target,
            instance.draft,
            self.target
        );
        let compiled = nvrtc::compile(
            &file.source(),
            &file.file_name(),
            &compile_options(&instance, &self.target),
        )
        .map_err(|e| match e {
            CudaError::Compile { log, .. } => Error::KernelBuild {
                backend: BackendKind::Cuda,
                kernel,
                log,
            },
            other => other.into_api(file.op().name()),
        })?;
        if !compiled.log.is_empty() {
            tracing::debug!(log = %compiled.log, "nvrtc log");
        }
        let ptx = match compiled.image {
            nvrtc::Image::Cubin(bytes) => Ptx::from_binary(bytes),
            nvrtc::Image::Ptx(bytes) => Ptx::from_src(nvrtc::ptx_text(&bytes)),
        };
        self.driver
            .ctx
            .load_module(ptx)
            .map_err(|e| CudaError::driver("cuModuleLoadData", e).into_api(file.op().name()))
    }

    /// The kernels of `file` built for `instance`, to launch (compiled at first use).
    pub(crate) fn kernels(&self, file: KernelFile, instance: Instance) -> Kernels<'_> {
        Kernels {
            device: self,
            file,
            instance,
        }
    }

    /// At least `bytes` of scratch for one op, from the device's arena (any content: the kernels
    /// write what they read), held until the guard is dropped.
    pub(crate) fn scratch(&self, op: Op, bytes: u64) -> Result<ScratchGuard<'_>> {
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| CudaError::Poisoned.into_api(op.name()))?;
        let ptr = scratch
            .arena
            .reserve(&self.driver, bytes)
            .map_err(|error| match error {
                Some(e) => self.api_error(e, op),
                None => Error::OutOfMemory {
                    backend: BackendKind::Cuda,
                    requested_bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
                },
            })?;
        Ok(ScratchGuard {
            device: self,
            scratch,
            ptr,
        })
    }

    /// The window address of a validated buffer.
    pub(crate) fn ptr(&self, op: Op, buffer: &Buffer) -> Result<u64> {
        storage::window_ptr(buffer).map_err(|e| e.into_api(op.name()))
    }

    /// The window address of an optional validated buffer (0 when absent).
    pub(crate) fn opt_ptr(&self, op: Op, buffer: Option<&Buffer>) -> Result<u64> {
        storage::optional_ptr(buffer).map_err(|e| e.into_api(op.name()))
    }

    /// The kernels' `vec` flag for `[vocab]` rows of `buffer`: 1 when they can be read four
    /// elements at a time.
    pub(crate) fn vec_ok(&self, op: Op, buffer: &Buffer, vocab: usize) -> Result<u32> {
        let ptr = self.ptr(op, buffer)?;
        Ok(u32::from(launch::vector_loads_ok(
            ptr,
            buffer.dtype().size_bytes(),
            vocab,
        )))
    }

    /// Enqueues the copy of `bytes` (exactly the window's size) into the window. No wait: the
    /// driver has staged `bytes` when the copy returns ([`Driver::copy_to_device`]), and every
    /// later op reads the window after the copy, in stream order.
    fn copy_into_window(&self, dst: &mut Buffer, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let CudaStorage::Owned(_) = storage::storage(dst).map_err(|e| e.into_api("upload"))? else {
            return Err(CudaError::BorrowedWrite.into_api("upload"));
        };
        let ptr = storage::window_ptr(dst).map_err(|e| e.into_api("upload"))?;
        self.driver
            .copy_to_device(bytes, ptr)
            .map_err(|e| self.api_error_for(e, Op::Memory, "upload"))
    }
}

/// The kernels of one file built for one instance on a device: what an op launches.
pub(crate) struct Kernels<'d> {
    device: &'d CudaDevice,
    file: KernelFile,
    instance: Instance,
}

impl Kernels<'_> {
    /// The function of entry `stem`, to launch with an `A` (in debug builds, `A` must be one of
    /// the file's argument structs, [`KernelFacts::args`](crate::kernels::KernelFacts::args)).
    fn function_for<A: CudaArgs>(&self, stem: &'static str) -> Result<&CudaFunction> {
        debug_assert!(
            self.file.facts().args.iter().any(|a| a.name == A::STRUCT),
            "{} takes no {}",
            self.file.file_name(),
            A::STRUCT
        );
        self.device.function(self.file, self.instance, stem)
    }

    /// Launches entry `stem`: `grid` blocks of `block` threads, one argument block, on the
    /// device's stream.
    pub(crate) fn launch<A: CudaArgs>(
        &self,
        stem: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        args: &A,
    ) -> Result<()> {
        let f = self.function_for::<A>(stem)?;
        // SAFETY: `args` is a `cuda_args!` struct, one of the file's (checked in debug builds by
        // `function_for`), from which the kernel's argument struct is generated with
        // `static_assert`s of its layout (`ArgsStruct::declaration`); every pointer in it is a
        // window of a validated buffer of this device, or scratch of the device's arena, which
        // lives until the stream has consumed it (a growth frees the old block stream-ordered).
        unsafe { self.device.driver.launch(f, grid, block, args, false) }
            .map_err(|e| CudaError::driver("cuLaunchKernel", e).into_api(self.file.op().name()))
    }

    /// Launches entry `stem` of a batch kernel: `blocks` blocks of [`launch::BATCH_BLOCK`]
    /// threads (one block per slot or row, a grid-stride loop, or one block for the batch).
    pub(crate) fn launch_batch<A: CudaArgs>(
        &self,
        stem: &'static str,
        blocks: u32,
        args: &A,
    ) -> Result<()> {
        self.launch(stem, (blocks, 1, 1), launch::BATCH_BLOCK, args)
    }

    /// As [`launch`](Self::launch), cooperatively (all blocks co-resident); `Ok(false)` when the
    /// grid does not fit the device at once, so the caller can fall back.
    pub(crate) fn launch_cooperative<A: CudaArgs>(
        &self,
        stem: &'static str,
        grid: (u32, u32, u32),
        block: u32,
        args: &A,
    ) -> Result<bool> {
        let f = self.function_for::<A>(stem)?;
        // SAFETY: as in `launch`.
        match unsafe { self.device.driver.launch(f, grid, block, args, true) } {
            Ok(()) => Ok(true),
            Err(cudarc::driver::DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
            )) => Ok(false),
            Err(e) => {
                Err(CudaError::driver("cuLaunchCooperativeKernel", e)
                    .into_api(self.file.op().name()))
            }
        }
    }
}

impl Backend for CudaDevice {
    fn desc(&self) -> &DeviceDesc {
        &self.desc
    }

    fn run_alloc_zeroed(&self, alloc: Alloc) -> Result<Buffer> {
        let oom = |requested_bytes| Error::OutOfMemory {
            backend: BackendKind::Cuda,
            requested_bytes,
        };
        let bytes = CudaStorage::allocation_bytes(alloc.bytes()).ok_or_else(|| oom(usize::MAX))?;
        let block =
            self.driver.alloc_zeroed(bytes).map_err(|e| match e {
                CudaError::Driver {
                    source:
                        cudarc::driver::DriverError(
                            cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                        ),
                    ..
                } => oom(bytes),
                other => self.api_error_for(other, Op::Memory, "alloc"),
            })?;
        Ok(Buffer::from_storage(
            alloc.dtype(),
            alloc.len(),
            self.desc.id,
            Box::new(CudaStorage::Owned(block)),
        ))
    }

    fn run_upload(&self, upload: Upload<'_>) -> Result<Buffer> {
        let mut buffer = self.run_alloc_zeroed(upload.alloc())?;
        self.copy_into_window(&mut buffer, upload.bytes())?;
        Ok(buffer)
    }

    fn run_write(&self, mut write: Write<'_, '_>) -> Result<()> {
        let (dst, bytes) = write.parts();
        self.copy_into_window(dst, bytes)
    }

    fn run_download(&self, download: Download<'_>) -> Result<Vec<u8>> {
        let out = self.copy_to_host(download)?;
        self.run_synchronize()?;
        Ok(out)
    }

    /// Every window's copy enqueued on the stream into one page-locked block, and an event
    /// behind them; returns at once, and the wait blocks once on the event (`src/download.rs`).
    fn run_start_download(&self, downloads: &[Download<'_>]) -> Result<PendingDownload> {
        self.start_pinned_download(downloads)
    }

    fn run_synchronize(&self) -> Result<()> {
        self.driver
            .synchronize()
            .map_err(|e| self.api_error_for(e, Op::Memory, "synchronize"))
    }

    fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
        specula_backend_api::dispatch_ops!(self, call)
    }

    /// Compiles (NVRTC) and loads every module of the plan, one per kernel file and instance,
    /// and looks up each of its functions ([`warm_up_plan`]).
    fn run_warm_up(&self, plan: &WarmUp) -> Result<()> {
        for (file, instance, stem) in warm_up_plan(plan) {
            self.function(file, instance, stem)?;
        }
        Ok(())
    }
}
