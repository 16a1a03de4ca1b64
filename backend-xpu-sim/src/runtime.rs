//! The OpenCL side: device discovery, buffers, the program cache and kernel launches.

use std::collections::HashMap;
use std::ptr;
use std::sync::Mutex;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_TYPE_ALL, Device as ClDevice};
use opencl3::error_codes::{
    CL_BUILD_PROGRAM_FAILURE, CL_INVALID_BUFFER_SIZE, CL_MEM_OBJECT_ALLOCATION_FAILURE,
    CL_OUT_OF_RESOURCES,
};
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer as ClBuffer, CL_MEM_READ_WRITE, ClMem};
use opencl3::platform::get_platforms;
use opencl3::program::Program;
use opencl3::types::{CL_BLOCKING, cl_mem};
use specula_backend_api::{BackendKind, Buffer, DType, Error, Result, abi};

use crate::error::XpuSimError;
use crate::launch::LaunchConfig;

/// Elements one core stages into its local tile at a time (the XPU GM→LM copy size).
pub(crate) const TILE: usize = 32;

/// The common kernel file: Philox, 128-bit helpers, keys, row primitives.
const COMMON: &str = include_str!("../kernels/common.cl");

/// One kernel source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    Layout,
    Gather,
    Argmax,
    Softmax,
    Sample,
    Candidates,
    Verify,
    UpdateState,
    Ngram,
    Logprobs,
}

impl Source {
    fn text(self) -> &'static str {
        match self {
            Source::Layout => include_str!("../kernels/layout.cl"),
            Source::Gather => include_str!("../kernels/gather_next_token.cl"),
            Source::Argmax => include_str!("../kernels/argmax.cl"),
            Source::Softmax => include_str!("../kernels/softmax.cl"),
            Source::Sample => include_str!("../kernels/top_k_top_p_sample.cl"),
            Source::Candidates => include_str!("../kernels/top_p_candidates.cl"),
            Source::Verify => include_str!("../kernels/verify_draft_tokens.cl"),
            Source::UpdateState => include_str!("../kernels/update_state.cl"),
            Source::Ngram => include_str!("../kernels/ngram_match.cl"),
            Source::Logprobs => include_str!("../kernels/accept_logprobs.cl"),
        }
    }
}

/// The storage behind an xpu-sim [`Buffer`]: one OpenCL buffer (at least 8 bytes, since OpenCL
/// has no empty buffers).
pub(crate) struct ClStorage {
    mem: ClBuffer<u8>,
}

impl ClStorage {
    fn raw(&self) -> cl_mem {
        self.mem.get()
    }
}

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// A buffer: its `cl_mem` and the element offset of its window.
    Mem(cl_mem, u64),
    U32(u32),
    U64(u64),
}

/// The arguments of one launch, built before the cache lock is taken.
#[derive(Debug, Default)]
pub(crate) struct Args(Vec<Arg>);

impl Args {
    pub(crate) fn new() -> Self {
        Args(Vec::with_capacity(32))
    }

    /// A buffer argument (its window offset travels with it).
    pub(crate) fn buf(&mut self, buffer: &Buffer) -> Result<&mut Self> {
        let storage = buffer
            .storage::<ClStorage>()
            .ok_or_else(|| XpuSimError::ForeignStorage.into_execution("kernel arguments"))?;
        self.0.push(Arg::Mem(storage.raw(), buffer.offset() as u64));
        Ok(self)
    }

    /// A raw buffer with window offset 0 (scratch and placeholder buffers).
    pub(crate) fn storage(&mut self, storage: &ClStorage) -> &mut Self {
        self.0.push(Arg::Mem(storage.raw(), 0));
        self
    }

    pub(crate) fn u32(&mut self, what: &'static str, value: usize) -> Result<&mut Self> {
        let v = u32::try_from(value)
            .map_err(|_| XpuSimError::TooLarge { what, value }.into_execution(what))?;
        self.0.push(Arg::U32(v));
        Ok(self)
    }

    pub(crate) fn u64(&mut self, value: u64) -> &mut Self {
        self.0.push(Arg::U64(value));
        self
    }
}

/// What a program is built from: the file and the build options (launch shape, dtypes, strategy).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ProgramKey {
    pub(crate) source: Source,
    pub(crate) defines: Vec<(&'static str, String)>,
}

#[derive(Default)]
struct Cache {
    programs: HashMap<ProgramKey, Program>,
    kernels: HashMap<(ProgramKey, String), Kernel>,
}

/// An opened OpenCL device with its queue and program cache.
pub(crate) struct Runtime {
    pub(crate) name: String,
    pub(crate) driver: String,
    pub(crate) max_alloc: u64,
    pub(crate) launch: LaunchConfig,
    context: Context,
    queue: CommandQueue,
    cache: Mutex<Cache>,
    base_options: String,
    placeholder: ClStorage,
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BackendKind::XpuSim,
        reason: reason.into(),
    }
}

/// Serialises OpenCL platform discovery, context creation and program builds across the process:
/// PoCL can crash when two threads initialise it or compile at the same time (seen with two
/// devices opened concurrently).
static OPENCL_INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn init_lock() -> std::sync::MutexGuard<'static, ()> {
    // A panic while holding the lock leaves nothing half-initialised that we rely on.
    OPENCL_INIT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every OpenCL device of every platform, in platform order (CPU devices included).
fn all_devices() -> Result<Vec<(String, ClDevice)>> {
    let platforms = get_platforms().map_err(|e| {
        unavailable(format!(
            "cannot load the OpenCL library or find a platform ({e}); install an ICD such as pocl-opencl-icd"
        ))
    })?;
    let mut devices = Vec::new();
    for platform in platforms {
        let platform_name = platform.name().unwrap_or_else(|_| "OpenCL".to_owned());
        // A platform without devices reports CL_DEVICE_NOT_FOUND: skip it.
        for id in platform.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default() {
            devices.push((platform_name.clone(), ClDevice::new(id)));
        }
    }
    Ok(devices)
}

impl Runtime {
    /// Opens OpenCL device `ordinal` (over all platforms and device types) with `launch`.
    pub(crate) fn open(ordinal: usize, launch: LaunchConfig) -> Result<Self> {
        let _guard = init_lock();
        let devices = all_devices()?;
        let count = devices.len();
        let (platform, device) = devices.into_iter().nth(ordinal).ok_or_else(|| {
            unavailable(format!(
                "no OpenCL device {ordinal} ({count} device(s) found over all platforms)"
            ))
        })?;
        let max_wg = device.max_work_group_size().unwrap_or(1);
        launch.check(max_wg)?;
        let name = device.name().unwrap_or_else(|_| "OpenCL device".to_owned());
        let version = device.version().unwrap_or_default();
        let max_alloc = device.max_mem_alloc_size().unwrap_or(u64::MAX);
        let context = Context::from_device(&device)
            .map_err(|e| unavailable(format!("cannot create an OpenCL context on {name}: {e}")))?;
        #[allow(deprecated)]
        let queue = CommandQueue::create_default(&context, 0)
            .map_err(|e| unavailable(format!("cannot create a command queue on {name}: {e}")))?;
        let placeholder = create_buffer(&context, 16)
            .map_err(|e| unavailable(format!("cannot allocate on {name}: {e}")))?;
        let base_options = base_options(launch);
        Ok(Runtime {
            driver: format!("{platform}, {version}, launch {launch}"),
            name,
            max_alloc,
            launch,
            context,
            queue,
            cache: Mutex::new(Cache::default()),
            base_options,
            placeholder,
        })
    }

    /// A small buffer passed for kernel arguments an op does not use.
    pub(crate) fn placeholder(&self) -> &ClStorage {
        &self.placeholder
    }

    /// A scratch or user buffer of `bytes` bytes (uninitialised).
    pub(crate) fn alloc(&self, bytes: usize) -> Result<ClStorage> {
        if bytes as u64 > self.max_alloc {
            return Err(Error::OutOfMemory {
                backend: BackendKind::XpuSim,
                requested_bytes: bytes,
            });
        }
        create_buffer(&self.context, bytes).map_err(|e| match e {
            XpuSimError::Cl { source, .. }
                if [
                    CL_MEM_OBJECT_ALLOCATION_FAILURE,
                    CL_OUT_OF_RESOURCES,
                    CL_INVALID_BUFFER_SIZE,
                ]
                .contains(&source.0) =>
            {
                Error::OutOfMemory {
                    backend: BackendKind::XpuSim,
                    requested_bytes: bytes,
                }
            }
            other => other.into_execution("alloc"),
        })
    }

    /// Fills `bytes` bytes at `offset` with zeros (enqueued).
    pub(crate) fn zero(&self, storage: &mut ClStorage, offset: usize, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the range lies inside the buffer (the caller sized it), the pattern outlives the
        // call (OpenCL copies it at enqueue).
        unsafe {
            self.queue
                .enqueue_fill_buffer(&mut storage.mem, &[0u8], offset, bytes, &[])
                .map_err(XpuSimError::cl("clEnqueueFillBuffer"))
                .map_err(|e| e.into_execution("alloc_zeroed"))?;
        }
        Ok(())
    }

    /// Copies `bytes` to the buffer at byte `offset`, blocking until done.
    pub(crate) fn write(&self, storage: &mut ClStorage, offset: usize, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: blocking write of a live host slice into a range inside the buffer.
        unsafe {
            self.queue
                .enqueue_write_buffer(&mut storage.mem, CL_BLOCKING, offset, bytes, &[])
                .map_err(XpuSimError::cl("clEnqueueWriteBuffer"))
                .map_err(|e| e.into_execution("write"))?;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes from byte `offset`, blocking until every enqueued op is done.
    pub(crate) fn read(&self, storage: &ClStorage, offset: usize, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return self.finish();
        }
        // SAFETY: blocking read into a live host slice from a range inside the buffer.
        unsafe {
            self.queue
                .enqueue_read_buffer(&storage.mem, CL_BLOCKING, offset, out, &[])
                .map_err(XpuSimError::cl("clEnqueueReadBuffer"))
                .map_err(|e| e.into_execution("download"))?;
        }
        Ok(())
    }

    /// Waits for the queue.
    pub(crate) fn finish(&self) -> Result<()> {
        self.queue
            .finish()
            .map_err(XpuSimError::cl("clFinish"))
            .map_err(|e| e.into_execution("synchronize"))
    }

    /// Enqueues kernel `name` of the program `key` over `clusters × cores`, building the program
    /// on first use.
    pub(crate) fn launch(&self, key: &ProgramKey, name: &str, args: &Args) -> Result<()> {
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| XpuSimError::Poisoned.into_execution(name))?;
        let cache = &mut *cache;
        if !cache.programs.contains_key(key) {
            let program = self.build(key, name)?;
            cache.programs.insert(key.clone(), program);
        }
        let kernel_key = (key.clone(), name.to_owned());
        if !cache.kernels.contains_key(&kernel_key) {
            let Some(program) = cache.programs.get(key) else {
                return Err(XpuSimError::MissingKernel(name.to_owned()).into_execution(name));
            };
            let kernel = Kernel::create(program, name)
                .map_err(XpuSimError::cl("clCreateKernel"))
                .map_err(|e| e.into_execution(name))?;
            cache.kernels.insert(kernel_key.clone(), kernel);
        }
        let Some(kernel) = cache.kernels.get(&kernel_key) else {
            return Err(XpuSimError::MissingKernel(name.to_owned()).into_execution(name));
        };
        let mut index = 0u32;
        for arg in &args.0 {
            // SAFETY: each argument has the size and kind the kernel declares (the host code and
            // the kernel signatures are kept in step; OpenCL checks the sizes of scalars).
            let result = unsafe {
                match arg {
                    Arg::Mem(mem, offset) => {
                        let first = kernel.set_arg(index, mem);
                        index += 1;
                        first.and_then(|()| kernel.set_arg(index, offset))
                    }
                    Arg::U32(v) => kernel.set_arg(index, v),
                    Arg::U64(v) => kernel.set_arg(index, v),
                }
            };
            index += 1;
            result
                .map_err(XpuSimError::cl("clSetKernelArg"))
                .map_err(|e| e.into_execution(name))?;
        }
        let local = self.launch.cores;
        let global = self.launch.clusters * local;
        // SAFETY: every argument is set; the buffers stay alive until the command completes
        // (OpenCL retains memory objects used by enqueued commands).
        unsafe {
            self.queue
                .enqueue_nd_range_kernel(kernel.get(), 1, ptr::null(), &global, &local, &[])
                .map_err(XpuSimError::cl("clEnqueueNDRangeKernel"))
                .map_err(|e| e.into_execution(name))?;
        }
        Ok(())
    }

    fn build(&self, key: &ProgramKey, name: &str) -> Result<Program> {
        let _guard = init_lock();
        let mut options = self.base_options.clone();
        for (define, value) in &key.defines {
            options.push_str(&format!(" -D {define}={value}"));
        }
        // One NUL-terminated source: cl3 passes no lengths, so OpenCL reads up to the NUL.
        let source = format!("{COMMON}\n{}\n\0", key.source.text());
        let mut program = Program::create_from_sources(&self.context, &[source.as_str()])
            .map_err(XpuSimError::cl("clCreateProgramWithSource"))
            .map_err(|e| e.into_execution(name))?;
        tracing::debug!(
            kernel = name,
            options = options.as_str(),
            "building OpenCL program"
        );
        match program.build(self.context.devices(), &options) {
            Ok(()) => Ok(program),
            Err(e) if e.0 == CL_BUILD_PROGRAM_FAILURE => {
                let log = self
                    .context
                    .devices()
                    .first()
                    .and_then(|&d| program.get_build_log(d).ok())
                    .unwrap_or_default();
                Err(Error::KernelBuild {
                    backend: BackendKind::XpuSim,
                    kernel: name.to_owned(),
                    log: format!("options: {options}\n{log}"),
                })
            }
            Err(e) => Err(XpuSimError::Cl {
                call: "clBuildProgram",
                source: e,
            }
            .into_execution(name)),
        }
    }
}

fn create_buffer(context: &Context, bytes: usize) -> std::result::Result<ClStorage, XpuSimError> {
    let size = bytes.max(8).next_multiple_of(8);
    // SAFETY: no host pointer is passed; the buffer is owned by the returned storage.
    let mem = unsafe { ClBuffer::<u8>::create(context, CL_MEM_READ_WRITE, size, ptr::null_mut()) }
        .map_err(XpuSimError::cl("clCreateBuffer"))?;
    Ok(ClStorage { mem })
}

/// The `-D` options every program gets: the shared constants of `backend_api::abi` and the launch.
fn base_options(launch: LaunchConfig) -> String {
    let defines: [(&str, String); 14] = [
        ("PHILOX_M0", format!("{:#x}u", abi::PHILOX_M0)),
        ("PHILOX_M1", format!("{:#x}u", abi::PHILOX_M1)),
        ("PHILOX_W0", format!("{:#x}u", abi::PHILOX_W0)),
        ("PHILOX_W1", format!("{:#x}u", abi::PHILOX_W1)),
        ("PHILOX_ROUNDS", abi::PHILOX_ROUNDS.to_string()),
        ("MAX_INFER_SEED", format!("{}ul", abi::MAX_INFER_SEED)),
        ("SEED_STRIDE", format!("{}ul", abi::SEED_STRIDE)),
        ("WEIGHT_BITS", abi::WEIGHT_BITS.to_string()),
        ("TOP_P_BITS", abi::TOP_P_BITS.to_string()),
        (
            "REJECTION_MAX_TOTAL_WEIGHT",
            format!("{}ul", abi::REJECTION_MAX_TOTAL_WEIGHT),
        ),
        ("MAX_CANDIDATES", abi::MAX_CANDIDATES.to_string()),
        ("MAX_LOGPROBS_TOP_K", abi::MAX_LOGPROBS_TOP_K.to_string()),
        ("CORES", launch.cores.to_string()),
        ("TILE", TILE.to_string()),
    ];
    let mut options = String::from("-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt");
    for (name, value) in defines {
        options.push_str(&format!(" -D {name}={value}"));
    }
    options
}

/// The storage-format code of a float dtype in kernels (`T_DTYPE` / `D_DTYPE`).
pub(crate) fn float_code(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "1",
        DType::BF16 => "2",
        _ => "0",
    }
}

/// The unsigned integer type of a dtype's size (`ELEM` of gather).
pub(crate) fn elem_type(dtype: DType) -> &'static str {
    match dtype.size_bytes() {
        1 => "uchar",
        2 => "ushort",
        8 => "ulong",
        _ => "uint",
    }
}
