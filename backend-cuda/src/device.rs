//! `CudaDevice`: probing, the kernel cache, launches, and the [`Backend`] implementation (memory
//! here, each op in `ops/<op>.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, DriverError,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use specula_backend_api::abi::KernelArgs;
use specula_backend_api::backend::{Alloc, AnyCall, Backend, DeviceDesc, Download, Upload, Write};
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, DType, DeviceInfo, Error, Op, PendingDownload, Result,
    WarmUp,
};

use crate::download::PinnedPool;
use crate::error::CudaError;
use crate::kernels::{Instance, KernelFile, compile_options, warm_up_plan};
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

/// One loaded module and the functions looked up in it.
struct LoadedModule {
    module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
}

/// One NVIDIA GPU: a context, one stream every op is enqueued on, and the kernels built for the
/// device's architecture (compiled by NVRTC at first use, cached per file and element types).
pub struct CudaDevice {
    desc: DeviceDesc,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    target: String,
    pub(crate) multiprocessors: u32,
    pub(crate) cooperative: bool,
    modules: Mutex<HashMap<(KernelFile, Instance), LoadedModule>>,
    /// The page-locked block downloads reuse ([`crate::download`]).
    pub(crate) pinned: PinnedPool,
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
    /// Enqueues the copy of a download's window to a new host vector on the stream (the caller
    /// synchronises).
    fn copy_to_host(&self, download: Download<'_>) -> Result<Vec<u8>> {
        let src = download.src();
        let (start, end) = storage::window_bytes(src);
        let mut out = vec![0u8; end - start];
        if out.is_empty() {
            return Ok(out);
        }
        match storage::storage(src).map_err(|e| e.into_api("download"))? {
            CudaStorage::Owned(slice) => {
                let view = slice
                    .try_slice(start..end)
                    .ok_or_else(|| CudaError::TooLarge { what: "window" }.into_api("download"))?;
                self.stream.memcpy_dtoh(&view, &mut out)
            }
            CudaStorage::Borrowed { ptr } => self.download_borrowed(*ptr + start as u64, &mut out),
        }
        .map_err(|e| CudaError::driver("cuMemcpyDtoHAsync", e).into_api("download"))?;
        Ok(out)
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
            float_dtypes: DType::FLOATS.to_vec(),
            max_buffer_bytes: total_mem,
            logits: true,
            sliced_processing: false,
            processing: true,
            fused_processing: false,
            row_block_bytes: None,
            sharded: true,
        };
        Ok(CudaDevice {
            desc: DeviceDesc::new(info, capabilities),
            ctx,
            stream,
            target,
            multiprocessors,
            cooperative,
            modules: Mutex::new(HashMap::new()),
            pinned: PinnedPool::default(),
        })
    }

    /// The architecture kernels are built for (`sm_90`, or `compute_XY` for a newer device).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The function `stem` of `file` built for `instance`, compiling and loading the module at
    /// first use. An NVRTC error is [`Error::KernelBuild`] with the log.
    fn function(&self, file: KernelFile, instance: Instance, stem: &str) -> Result<CudaFunction> {
        let entry = instance.entry(stem);
        let mut modules = self
            .modules
            .lock()
            .map_err(|_| CudaError::Poisoned.into_api(file.op().name()))?;
        let loaded = match modules.entry((file, instance)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(self.build_module(file, instance)?)
            }
        };
        if let Some(f) = loaded.functions.get(&entry) {
            return Ok(f.clone());
        }
        let f = loaded
            .module
            .load_function(&entry)
            .map_err(|e| CudaError::driver("cuModuleGetFunction", e).into_api(file.op().name()))?;
        loaded.functions.insert(entry, f.clone());
        Ok(f)
    }

    /// Compiles `file` for `instance` with NVRTC and loads it into the context.
    fn build_module(&self, file: KernelFile, instance: Instance) -> Result<LoadedModule> {
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
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| CudaError::driver("cuModuleLoadData", e).into_api(file.op().name()))?;
        Ok(LoadedModule {
            module,
            functions: HashMap::new(),
        })
    }

    /// The kernels of `file` built for `instance`, to launch (compiled at first use).
    pub(crate) fn kernels(&self, file: KernelFile, instance: Instance) -> Kernels<'_> {
        Kernels {
            device: self,
            file,
            instance,
        }
    }

    /// Enqueues `f` with one argument block on the device's stream, cooperatively or not.
    fn enqueue<A: KernelArgs + DeviceRepr>(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &A,
        cooperative: bool,
    ) -> std::result::Result<(), DriverError> {
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = self.stream.launch_builder(f);
        builder.arg(args);
        // SAFETY: `args` is a `kernel_args!` struct that mirrors the kernel's argument struct field
        // for field (checked by `args::tests`); every pointer in it is a window of a validated
        // buffer of this device, or scratch that lives until the stream has consumed it (freed
        // stream-ordered on drop).
        let launched = unsafe {
            if cooperative {
                builder.launch_cooperative(cfg)
            } else {
                builder.launch(cfg)
            }
        };
        launched.map(|_| ())
    }

    /// Zeroed scratch memory for one op (freed, stream-ordered, when dropped).
    pub(crate) fn scratch(&self, op: Op, bytes: u64) -> Result<CudaSlice<u8>> {
        let bytes = usize::try_from(bytes.max(8)).map_err(|_| Error::OutOfMemory {
            backend: BackendKind::Cuda,
            requested_bytes: usize::MAX,
        })?;
        self.stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| CudaError::driver("cuMemAllocAsync", e).into_api(op.name()))
    }

    /// The device address of a scratch allocation.
    pub(crate) fn scratch_ptr(&self, scratch: &CudaSlice<u8>) -> u64 {
        use cudarc::driver::DevicePtr;
        let (ptr, _guard) = scratch.device_ptr(&self.stream);
        ptr
    }

    /// The window address of a validated buffer.
    pub(crate) fn ptr(&self, op: Op, buffer: &Buffer) -> Result<u64> {
        storage::window_ptr(buffer, &self.stream).map_err(|e| e.into_api(op.name()))
    }

    /// The window address of an optional validated buffer (0 when absent).
    pub(crate) fn opt_ptr(&self, op: Op, buffer: Option<&Buffer>) -> Result<u64> {
        storage::optional_ptr(buffer, &self.stream).map_err(|e| e.into_api(op.name()))
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

    /// Copies `bytes` (exactly the window's size) into the window and waits for the copy.
    fn copy_into_window(&self, dst: &mut Buffer, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let (start, end) = storage::window_bytes(dst);
        let CudaStorage::Owned(slice) =
            storage::storage_mut(dst).map_err(|e| e.into_api("upload"))?
        else {
            return Err(CudaError::BorrowedWrite.into_api("upload"));
        };
        let mut view = slice
            .try_slice_mut(start..end)
            .ok_or_else(|| CudaError::TooLarge { what: "window" }.into_api("upload"))?;
        self.stream
            .memcpy_htod(bytes, &mut view)
            .map_err(|e| CudaError::driver("cuMemcpyHtoDAsync", e).into_api("upload"))?;
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("cuStreamSynchronize", e).into_api("upload"))
    }
}

/// The kernels of one file built for one instance on a device: what an op launches.
pub(crate) struct Kernels<'d> {
    device: &'d CudaDevice,
    file: KernelFile,
    instance: Instance,
}

impl Kernels<'_> {
    /// Launches entry `stem`: `grid` blocks of `block` threads, one argument block, on the
    /// device's stream.
    pub(crate) fn launch<A: KernelArgs + DeviceRepr>(
        &self,
        stem: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &A,
    ) -> Result<()> {
        let f = self.device.function(self.file, self.instance, stem)?;
        self.device
            .enqueue(&f, grid, block, args, false)
            .map_err(|e| CudaError::driver("cuLaunchKernel", e).into_api(self.file.op().name()))
    }

    /// As [`launch`](Self::launch), cooperatively (all blocks co-resident); `Ok(false)` when the
    /// grid does not fit the device at once, so the caller can fall back.
    pub(crate) fn launch_cooperative<A: KernelArgs + DeviceRepr>(
        &self,
        stem: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &A,
    ) -> Result<bool> {
        let f = self.device.function(self.file, self.instance, stem)?;
        match self.device.enqueue(&f, grid, block, args, true) {
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
        let slice = self.stream.alloc_zeros::<u8>(bytes).map_err(|e| match e {
            cudarc::driver::DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            ) => oom(bytes),
            other => CudaError::driver("cuMemAlloc", other).into_api("alloc"),
        })?;
        Ok(Buffer::from_storage(
            alloc.dtype(),
            alloc.len(),
            self.desc.id,
            Box::new(CudaStorage::Owned(slice)),
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
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("cuStreamSynchronize", e).into_api("synchronize"))
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
