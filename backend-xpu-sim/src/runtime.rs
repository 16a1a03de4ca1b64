//! The OpenCL side: device discovery, buffers, the program cache and kernel launches.

use std::collections::HashMap;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytemuck::Pod;
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{CL_DEVICE_TYPE_ALL, Device as ClDevice};
use opencl3::error_codes::{
    CL_BUILD_PROGRAM_FAILURE, CL_INVALID_BUFFER_SIZE, CL_MEM_OBJECT_ALLOCATION_FAILURE,
    CL_OUT_OF_RESOURCES,
};
use opencl3::event::Event;
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer as ClBuffer, CL_MEM_READ_WRITE, ClMem};
use opencl3::platform::get_platforms;
use opencl3::program::Program as ClProgram;
use opencl3::types::{CL_BLOCKING, CL_NON_BLOCKING, cl_mem};
use specula_backend_api::abi::{self, KernelArgs, KernelField};
use specula_backend_api::logit_weights;
use specula_backend_api::transfer::{DownloadWait, PendingDownload};
use specula_backend_api::{BackendKind, Buffer, Error, Op, Result};

use crate::error::XpuSimError;
use crate::launch::LaunchConfig;

/// Elements one core stages into its local tile at a time (the XPU GM→LM copy size).
pub(crate) const TILE: usize = 32;

/// Non-blocking reads in flight and the host memory they write into.
struct Reads {
    events: Vec<Event>,
    out: Vec<Vec<u8>>,
}

impl Reads {
    /// Waits for every read (all of them, even after a failed one).
    fn wait_all(&mut self) -> Result<()> {
        let waited: Vec<_> = std::mem::take(&mut self.events)
            .iter()
            .map(Event::wait)
            .collect();
        waited
            .into_iter()
            .collect::<std::result::Result<Vec<()>, _>>()
            .map_err(XpuSimError::cl("clWaitForEvents"))
            .map_err(|e| e.into_execution("download"))?;
        Ok(())
    }
}

impl DownloadWait for Reads {
    fn wait(mut self: Box<Self>) -> Result<Vec<Vec<u8>>> {
        self.wait_all()?;
        Ok(std::mem::take(&mut self.out))
    }
}

impl Drop for Reads {
    /// The reads write into `out`: it is freed only once they are done.
    fn drop(&mut self) {
        let _ = self.wait_all();
    }
}

/// The largest buffer this backend allocates: `4 · (2^32 − 1)` bytes, or the device's own limit when
/// that is lower (reported as `Capabilities::max_buffer_bytes`, so the front refuses larger buffers).
/// Kernels take element counts as 32-bit `uint`s: with this bound a buffer of 4-byte (or wider)
/// elements has fewer than 2^32 of them, so every count the host passes fits (see
/// [`crate::ops::count`]).
pub(crate) const MAX_BUFFER_BYTES: u64 = 4 * u32::MAX as u64;

/// The storage behind an xpu-sim [`Buffer`]: one OpenCL buffer (at least 8 bytes, since OpenCL
/// has no empty buffers).
pub(crate) struct ClStorage {
    mem: ClBuffer<u8>,
}

impl ClStorage {
    /// The OpenCL memory object, as a kernel argument.
    pub(crate) fn raw(&self) -> cl_mem {
        self.mem.get()
    }
}

/// The buffer parameters of one launch, in the kernel's order: each buffer with the element offset
/// of its window, the two kernel parameters of its `BUF(T, name)` (`__global T* name_b`, `ulong
/// name_offset`). `KernelBuffers::of(&[a, b])?` binds a launch whose buffers are all call buffers;
/// the chained `bind`, `bind_optional` and `bind_scratch` list mixed ones, in parameter order.
#[derive(Default)]
pub(crate) struct KernelBuffers(Vec<(cl_mem, u64)>);

impl KernelBuffers {
    /// The xpu-sim buffers `buffers`, in order.
    pub(crate) fn of(buffers: &[&Buffer]) -> Result<Self> {
        let mut bound = Self::default();
        bound.bind(buffers)?;
        Ok(bound)
    }

    /// Appends xpu-sim buffers, each with its window offset.
    pub(crate) fn bind(&mut self, buffers: &[&Buffer]) -> Result<&mut Self> {
        for buffer in buffers {
            let mem = buffer
                .storage::<ClStorage>()
                .map(ClStorage::raw)
                .ok_or_else(|| XpuSimError::ForeignStorage.into_execution("kernel arguments"))?;
            self.0.push((mem, buffer.offset() as u64));
        }
        Ok(self)
    }

    /// Appends a whole scratch buffer (offset 0).
    pub(crate) fn bind_scratch(&mut self, scratch: &ClStorage) -> &mut Self {
        self.0.push((scratch.raw(), 0));
        self
    }

    /// Appends each buffer, or the runtime's placeholder (offset 0) for a parameter the call does
    /// not use.
    pub(crate) fn bind_optional(
        &mut self,
        runtime: &Runtime,
        buffers: &[Option<&Buffer>],
    ) -> Result<&mut Self> {
        for &buffer in buffers {
            match buffer {
                Some(buffer) => self.bind(&[buffer])?,
                None => self.bind_scratch(runtime.placeholder()),
            };
        }
        Ok(self)
    }
}

/// What a program is built from: the op's kernel file and the build options (entry point, dtypes,
/// strategy; the launch shape and shared constants are in every program's base options).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ProgramKey {
    pub(crate) op: Op,
    pub(crate) defines: Vec<(&'static str, String)>,
}

/// One program an op may launch, and the kernels it creates from it (what the warm-up builds).
pub(crate) type Program = (ProgramKey, Vec<String>);

/// A kernel argument struct as its program declares it: the name and fields of a
/// [`kernel_args!`](specula_backend_api::kernel_args) struct.
pub(crate) struct ArgsStruct {
    pub(crate) name: &'static str,
    pub(crate) fields: &'static [KernelField],
}

impl ArgsStruct {
    /// The struct `A`.
    pub(crate) const fn of<A: KernelArgs>() -> Self {
        ArgsStruct {
            name: A::STRUCT,
            fields: A::FIELDS,
        }
    }

    /// Its OpenCL C declaration: `ulong` for the 64-bit fields, `uint` for the 32-bit ones.
    pub(crate) fn declaration(&self) -> String {
        abi::c_struct_declaration(self.name, self.fields, "ulong", "uint")
    }
}

#[derive(Default)]
struct Cache {
    programs: HashMap<ProgramKey, ClProgram>,
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
    /// How many programs were built (each once, then cached).
    built: AtomicUsize,
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
        let max_alloc = device
            .max_mem_alloc_size()
            .unwrap_or(u64::MAX)
            .min(MAX_BUFFER_BYTES);
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
            built: AtomicUsize::new(0),
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

    /// Enqueues a non-blocking read of each window `(storage, byte offset, bytes)` behind every
    /// enqueued op and flushes the queue, without waiting: [`PendingDownload::wait`] waits once
    /// for all of them.
    pub(crate) fn start_read(
        &self,
        windows: &[(&ClStorage, usize, usize)],
    ) -> Result<PendingDownload> {
        let mut reads = Reads {
            events: Vec::with_capacity(windows.len()),
            out: windows
                .iter()
                .map(|&(_, _, bytes)| vec![0u8; bytes])
                .collect(),
        };
        for (&(storage, offset, _), out) in windows.iter().zip(reads.out.iter_mut()) {
            if out.is_empty() {
                continue;
            }
            // SAFETY: a non-blocking read from a range inside the buffer (the front validated the
            // window) into `out`, a heap allocation owned by `reads` that neither moves nor is
            // freed before the read completes: `Reads` waits for every event before it hands the
            // bytes out, and its `Drop` waits for them too.
            let event = unsafe {
                self.queue
                    .enqueue_read_buffer(&storage.mem, CL_NON_BLOCKING, offset, out, &[])
            }
            .map_err(XpuSimError::cl("clEnqueueReadBuffer"))
            .map_err(|e| e.into_execution("download"))?;
            reads.events.push(event);
        }
        self.queue
            .flush()
            .map_err(XpuSimError::cl("clFlush"))
            .map_err(|e| e.into_execution("download"))?;
        Ok(PendingDownload::waiting(Box::new(reads)))
    }

    /// Waits for the queue.
    pub(crate) fn finish(&self) -> Result<()> {
        self.queue
            .finish()
            .map_err(XpuSimError::cl("clFinish"))
            .map_err(|e| e.into_execution("synchronize"))
    }

    /// Enqueues kernel `name` of the program `key` over `clusters × cores`, building the program
    /// on first use. The kernel's parameters are `buffers` (positional, in the kernel's order, each
    /// followed by its window offset), then `args` by value: the struct of the same name, which
    /// the program declares from `A`.
    pub(crate) fn launch<A: KernelArgs + Pod>(
        &self,
        key: &ProgramKey,
        name: &str,
        buffers: &KernelBuffers,
        args: &A,
    ) -> Result<()> {
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| XpuSimError::Poisoned.into_execution(name))?;
        let kernel = self.kernel(&mut cache, key, name)?;
        set_args(kernel, &buffers.0, args).map_err(|e| e.into_execution(name))?;
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

    /// How many programs were built so far.
    pub(crate) fn programs_built(&self) -> usize {
        self.built.load(Ordering::Relaxed)
    }

    /// Builds the program `key` and creates its kernel `name` unless they are cached (the
    /// warm-up).
    pub(crate) fn prepare(&self, key: &ProgramKey, name: &str) -> Result<()> {
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| XpuSimError::Poisoned.into_execution(name))?;
        self.kernel(&mut cache, key, name).map(drop)
    }

    /// Kernel `name` of the program `key`, built and created on first use.
    fn kernel<'c>(&self, cache: &'c mut Cache, key: &ProgramKey, name: &str) -> Result<&'c Kernel> {
        if !cache.programs.contains_key(key) {
            let program = self.build(key, name)?;
            cache.programs.insert(key.clone(), program);
            self.built.fetch_add(1, Ordering::Relaxed);
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
        cache
            .kernels
            .get(&kernel_key)
            .ok_or_else(|| XpuSimError::MissingKernel(name.to_owned()).into_execution(name))
    }

    fn build(&self, key: &ProgramKey, name: &str) -> Result<ClProgram> {
        let _guard = init_lock();
        let mut options = self.base_options.clone();
        for (define, value) in &key.defines {
            options.push_str(&format!(" -D {define}={value}"));
        }
        // One NUL-terminated source: cl3 passes no lengths, so OpenCL reads up to the NUL.
        let mut source = key
            .source()
            .ok_or_else(|| XpuSimError::MissingKernel(name.to_owned()).into_execution(name))?;
        source.push('\0');
        let mut program = ClProgram::create_from_sources(&self.context, &[source.as_str()])
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

/// Sets the kernel's parameters: each buffer and its window offset, then the argument struct by
/// value.
fn set_args<A: KernelArgs + Pod>(
    kernel: &Kernel,
    buffers: &[(cl_mem, u64)],
    args: &A,
) -> std::result::Result<(), XpuSimError> {
    debug_assert_eq!(
        kernel.num_args().ok(),
        u32::try_from(2 * buffers.len() + 1).ok(),
        "two parameters per buffer, then {}",
        A::STRUCT
    );
    let mut index = 0;
    for (buffer, offset) in buffers {
        // SAFETY: a live OpenCL memory object for a `__global` pointer parameter; the host code
        // passes the buffers in the order of the kernel's parameters.
        unsafe { kernel.set_arg(index, buffer) }.map_err(XpuSimError::cl("clSetKernelArg"))?;
        // SAFETY: a `u64` for the `ulong <name>_offset` parameter after each buffer (`BUF`).
        unsafe { kernel.set_arg(index + 1, offset) }.map_err(XpuSimError::cl("clSetKernelArg"))?;
        index += 2;
    }
    // SAFETY: `A` is `#[repr(C)]` plain old data without padding (`Pod`), and the struct the kernel
    // takes by value after its buffers is generated from it (`ProgramKey::source`; `ops::tests` checks
    // every struct against the program); OpenCL checks the size.
    unsafe { kernel.set_arg(index, args) }.map_err(XpuSimError::cl("clSetKernelArg"))?;
    Ok(())
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
    let defines: [(&str, String); 16] = [
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
        ("SHARD_KEY_ID_BITS", abi::SHARD_KEY_ID_BITS.to_string()),
        ("MAX_SHARD_RECORDS", abi::MAX_SHARD_RECORDS.to_string()),
        ("CORES", launch.cores.to_string()),
        ("TILE", TILE.to_string()),
    ];
    // No fast-math option: the gap of `docs/semantics.md` §4b is one IEEE f32 subtraction (common.cl).
    let mut options = String::from("-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt");
    for (name, value) in defines.into_iter().chain(logits_defines()) {
        options.push_str(&format!(" -D {name}={value}"));
    }
    options
}

/// The `-D` options of `docs/semantics.md` §4b: the constants of `backend_api::logit_weights` and the bounds
/// of its `sanitize_logit` as f32 bit patterns.
fn logits_defines() -> [(&'static str, String); 6] {
    let coefficients: Vec<String> = logit_weights::EXP2_COEFFICIENTS
        .iter()
        .map(|a| format!("{a}ul"))
        .collect();
    [
        ("LOG2E_Q63", format!("{:#x}ul", logit_weights::LOG2E_Q63)),
        (
            "GAP_FRACTION_BITS",
            logit_weights::GAP_FRACTION_BITS.to_string(),
        ),
        ("GAP_LIMIT", format!("{}ul", logit_weights::GAP_LIMIT)),
        ("EXP2_COEFFICIENTS", coefficients.join(",")),
        (
            "LOGIT_TINY_BITS",
            format!("{:#x}u", logit_weights::logit_tiny_bits()),
        ),
        (
            "LOGIT_HUGE_BITS",
            format!("{:#x}u", logit_weights::logit_huge_bits()),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logits_defines_carry_the_bounds_of_sanitize_logit() {
        // 2^-76 and 2^64 (`docs/semantics.md` §4b step 1).
        let defines = logits_defines();
        let value = |name: &str| defines.iter().find(|d| d.0 == name).map(|d| d.1.clone());
        assert_eq!(value("LOGIT_TINY_BITS").as_deref(), Some("0x19800000u"));
        assert_eq!(value("LOGIT_HUGE_BITS").as_deref(), Some("0x5f800000u"));
    }
}
