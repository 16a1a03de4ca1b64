//! The wgpu device and queue, buffer windows as bindings, the pipeline cache, and the recording
//! and submission of an op's dispatches with error capture.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use specula_backend_api::{BackendKind, Buffer, Error, Op, Result};
use wgpu::util::DeviceExt as _;

use crate::error::{WgpuError, execution, unsupported};
use crate::kernels::{Kernel, shader_source};

/// Environment variable lowering the largest storage binding used for row matrices (bytes), so
/// that the chunked paths can be exercised with small inputs.
pub const MAX_BINDING_VAR: &str = "SPECULA_WGPU_MAX_BINDING_BYTES";

/// The storage of a wgpu buffer: the allocation and its size in bytes (a multiple of 4, at least 16,
/// whatever the logical length, because wgpu rejects empty buffers and unaligned copies).
#[derive(Debug)]
pub(crate) struct WgpuStorage {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) bytes: u64,
}

/// A buffer range bound to a shader, and the offset of the requested first element inside it, in
/// the shader's index units (words for 4- and 8-byte elements, halves for 2-byte, bytes for u8).
#[derive(Clone, Debug)]
pub(crate) struct Bound {
    buffer: wgpu::Buffer,
    offset: u64,
    size: u64,
    /// Index of the first requested element within the binding.
    pub(crate) index: u32,
}

/// One compute dispatch of an op.
#[derive(Debug)]
pub(crate) struct Dispatch {
    pub(crate) kernel: Kernel,
    pub(crate) entry: String,
    pub(crate) params_binding: u32,
    /// The bytes of the kernel's argument struct (a `KernelArgs`), bound as the uniform.
    pub(crate) params: Vec<u8>,
    pub(crate) bindings: Vec<(u32, Bound)>,
    /// Workgroups (split into two dimensions above 65535).
    pub(crate) groups: u32,
}

/// The opened adapter.
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
    /// The largest binding used for row matrices (the adapter's limit unless lowered by
    /// [`MAX_BINDING_VAR`]).
    pub(crate) matrix_binding_bytes: u64,
    modules: Mutex<HashMap<Kernel, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<String, wgpu::ComputePipeline>>,
    /// How many compute pipelines were compiled (each once, then cached).
    built: AtomicUsize,
    lost: Arc<Mutex<Option<String>>>,
    uncaptured: Arc<Mutex<Option<String>>>,
    dummy: wgpu::Buffer,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("matrix_binding_bytes", &self.matrix_binding_bytes)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Gpu {
    pub(crate) fn new(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let limits = device.limits();
        let lost = Arc::new(Mutex::new(None));
        let lost_cb = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            *lock(&lost_cb) = Some(format!("{reason:?}: {message}"));
        });
        // Errors outside our scopes (there should be none) are kept instead of panicking.
        let uncaptured = Arc::new(Mutex::new(None));
        let uncaptured_cb = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            *lock(&uncaptured_cb) = Some(error.to_string());
        }));
        let mut matrix_binding_bytes = limits.max_storage_buffer_binding_size;
        if let Some(v) = std::env::var(MAX_BINDING_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            matrix_binding_bytes = matrix_binding_bytes.min(v.max(4));
        }
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specula dummy"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Gpu {
            device,
            queue,
            limits,
            matrix_binding_bytes,
            modules: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            built: AtomicUsize::new(0),
            lost,
            uncaptured,
            dummy,
        }
    }

    /// Fails if the device was lost or an error escaped the error scopes.
    pub(crate) fn check_alive(&self, what: &str) -> Result<()> {
        if let Some(reason) = lock(&self.lost).clone() {
            return Err(execution(what, WgpuError::DeviceLost(reason)));
        }
        if let Some(message) = lock(&self.uncaptured).take() {
            return Err(execution(what, WgpuError::Internal(message)));
        }
        Ok(())
    }

    /// The binding offset alignment of storage buffers.
    fn alignment(&self) -> u64 {
        u64::from(self.limits.min_storage_buffer_offset_alignment.max(4))
    }

    /// Allocates a zeroed storage buffer of at least `bytes` bytes.
    pub(crate) fn create_storage(&self, bytes: u64, label: &str) -> Result<WgpuStorage> {
        let size = bytes.div_ceil(4).saturating_mul(4).max(16);
        if size > self.limits.max_buffer_size {
            return Err(Error::OutOfMemory {
                backend: BackendKind::Wgpu,
                requested_bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if pollster::block_on(scope.pop()).is_some() {
            return Err(Error::OutOfMemory {
                backend: BackendKind::Wgpu,
                requested_bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
            });
        }
        Ok(WgpuStorage {
            buffer,
            bytes: size,
        })
    }

    /// A binding of the whole window of `buffer`.
    pub(crate) fn bind(&self, op: Op, buffer: &Buffer) -> Result<Bound> {
        self.bind_elems(
            op,
            buffer,
            0,
            buffer.len(),
            self.limits.max_storage_buffer_binding_size,
        )
    }

    /// A binding of elements `first .. first + count` of the window of `buffer`, within `limit`
    /// bytes (plus the alignment slack).
    pub(crate) fn bind_elems(
        &self,
        op: Op,
        buffer: &Buffer,
        first: usize,
        count: usize,
        limit: u64,
    ) -> Result<Bound> {
        let storage = storage_of(buffer)?;
        let es = buffer.dtype().size_bytes() as u64;
        if count == 0 {
            return Ok(Bound {
                buffer: storage.buffer.clone(),
                offset: 0,
                size: 4,
                index: 0,
            });
        }
        let start = (buffer.offset() + first) as u64 * es;
        let len = count as u64 * es;
        let align = self.alignment();
        let aligned = start / align * align;
        let delta = start - aligned;
        let size = (delta + len).div_ceil(4) * 4;
        let size = size.min(storage.bytes - aligned);
        if size > self.limits.max_storage_buffer_binding_size || size > limit + align + 4 {
            return Err(unsupported(
                op,
                format!(
                    "a buffer window of {len} bytes (the adapter's largest storage binding is {} bytes)",
                    self.limits.max_storage_buffer_binding_size
                ),
            ));
        }
        let unit = if es == 8 { 4 } else { es };
        let index = u32::try_from(delta / unit).unwrap_or(u32::MAX);
        Ok(Bound {
            buffer: storage.buffer.clone(),
            offset: aligned,
            size,
            index,
        })
    }

    /// A binding of a whole internal scratch buffer.
    pub(crate) fn bind_scratch(&self, storage: &WgpuStorage) -> Bound {
        Bound {
            buffer: storage.buffer.clone(),
            offset: 0,
            size: storage.bytes,
            index: 0,
        }
    }

    /// A small buffer for bindings an entry point declares but this call does not use.
    pub(crate) fn dummy(&self) -> Bound {
        Bound {
            buffer: self.dummy.clone(),
            offset: 0,
            size: 16,
            index: 0,
        }
    }

    /// Row chunks `[lo, hi)` of a `[rows, row_len]` matrix such that each chunk's binding fits the
    /// matrix binding limit (at least one row per chunk).
    pub(crate) fn row_chunks(
        &self,
        buffer: &Buffer,
        rows: usize,
        row_len: usize,
    ) -> Vec<(usize, usize)> {
        let row_bytes = (row_len * buffer.dtype().size_bytes()).max(1) as u64;
        let per = (self.matrix_binding_bytes / row_bytes).max(1);
        let per = usize::try_from(per).unwrap_or(usize::MAX);
        let mut chunks = Vec::new();
        let mut lo = 0;
        while lo < rows {
            let hi = rows.min(lo.saturating_add(per));
            chunks.push((lo, hi));
            lo = hi;
        }
        chunks
    }

    /// The binding of rows `lo .. hi` of a `[rows, row_len]` matrix.
    pub(crate) fn bind_rows(
        &self,
        op: Op,
        buffer: &Buffer,
        row_len: usize,
        (lo, hi): (usize, usize),
    ) -> Result<Bound> {
        self.bind_elems(
            op,
            buffer,
            lo * row_len,
            (hi - lo) * row_len,
            self.matrix_binding_bytes
                .max((row_len * buffer.dtype().size_bytes()) as u64),
        )
    }

    fn module(&self, kernel: Kernel) -> Result<wgpu::ShaderModule> {
        if let Some(m) = lock(&self.modules).get(&kernel) {
            return Ok(m.clone());
        }
        let source = shader_source(kernel);
        let file = kernel.file();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&file),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(Error::KernelBuild {
                backend: BackendKind::Wgpu,
                kernel: file,
                log: error.to_string(),
            });
        }
        lock(&self.modules).insert(kernel, module.clone());
        Ok(module)
    }

    /// How many compute pipelines were compiled so far.
    pub(crate) fn pipelines_built(&self) -> usize {
        self.built.load(Ordering::Relaxed)
    }

    /// Compiles the pipelines of `entries` of `kernel`'s module unless they are cached, and
    /// records one empty dispatch (no workgroup) of each, bound to placeholder buffers, in one
    /// submission: a driver that finishes compiling at a pipeline's first dispatch (lavapipe's
    /// LLVM code generation) does it now (the warm-up).
    pub(crate) fn prepare(&self, kernel: Kernel, entries: &[String]) -> Result<()> {
        let bindings = warm::entry_bindings(kernel, entries)?;
        let pipelines = entries
            .iter()
            .map(|entry| self.pipeline(kernel, entry))
            .collect::<Result<Vec<_>>>()?;
        let what = kernel.op().name();
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(what) });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(what),
                timestamp_writes: None,
            });
            for ((entry, pipeline), used) in entries.iter().zip(&pipelines).zip(&bindings) {
                let buffers = warm::placeholders(&self.device, used);
                let resources: Vec<wgpu::BindGroupEntry<'_>> = used
                    .iter()
                    .zip(&buffers)
                    .map(|(b, buffer)| wgpu::BindGroupEntry {
                        binding: b.binding,
                        resource: buffer.as_entire_binding(),
                    })
                    .collect();
                let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(entry),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &resources,
                });
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(0, 0, 0);
            }
        }
        self.queue.submit([encoder.finish()]);
        if let Some(error) = pollster::block_on(validation.pop()) {
            return Err(execution(what, WgpuError::from(error)));
        }
        Ok(())
    }

    /// The compute pipeline of an entry point, compiled once and cached.
    fn pipeline(&self, kernel: Kernel, entry: &str) -> Result<wgpu::ComputePipeline> {
        if let Some(p) = lock(&self.pipelines).get(entry) {
            return Ok(p.clone());
        }
        let module = self.module(kernel)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(Error::KernelBuild {
                backend: BackendKind::Wgpu,
                kernel: entry.to_owned(),
                log: error.to_string(),
            });
        }
        lock(&self.pipelines).insert(entry.to_owned(), pipeline.clone());
        self.built.fetch_add(1, Ordering::Relaxed);
        Ok(pipeline)
    }

    /// Records every dispatch of an op in one compute pass and submits it once.
    pub(crate) fn run(&self, op: Op, dispatches: Vec<Dispatch>) -> Result<()> {
        self.check_alive(op.name())?;
        let dispatches: Vec<Dispatch> = dispatches.into_iter().filter(|d| d.groups > 0).collect();
        if dispatches.is_empty() {
            return Ok(());
        }
        let mut prepared = Vec::with_capacity(dispatches.len());
        for d in &dispatches {
            prepared.push(self.pipeline(d.kernel, &d.entry)?);
        }
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some(op.name()),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(op.name()),
                timestamp_writes: None,
            });
            for (d, pipeline) in dispatches.iter().zip(&prepared) {
                let uniform = self
                    .device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("specula params"),
                        contents: &d.params,
                        usage: wgpu::BufferUsages::UNIFORM,
                    });
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: d.params_binding,
                    resource: uniform.as_entire_binding(),
                }];
                for (binding, bound) in &d.bindings {
                    entries.push(wgpu::BindGroupEntry {
                        binding: *binding,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &bound.buffer,
                            offset: bound.offset,
                            size: NonZeroU64::new(bound.size),
                        }),
                    });
                }
                let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&d.entry),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                });
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, &group, &[]);
                let max = self.limits.max_compute_workgroups_per_dimension.max(1);
                let x = d.groups.min(max);
                let y = d.groups.div_ceil(x);
                pass.dispatch_workgroups(x, y, 1);
            }
        }
        self.queue.submit([encoder.finish()]);
        let memory_error = pollster::block_on(memory.pop());
        let validation_error = pollster::block_on(validation.pop());
        if let Some(error) = validation_error.or(memory_error) {
            return Err(execution(op.name(), WgpuError::from(error)));
        }
        Ok(())
    }

    /// Waits for every submitted command.
    pub(crate) fn wait(&self, what: &str) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| execution(what, WgpuError::Poll(e.to_string())))?;
        self.check_alive(what)
    }

    /// Copies `bytes` bytes at byte `start` of a storage buffer to the host (blocking): the
    /// batched download of one window, waited for at once.
    pub(crate) fn read(&self, storage: &WgpuStorage, start: u64, bytes: u64) -> Result<Vec<u8>> {
        let mut read = self.start_read(&[(storage, start, bytes)])?.wait()?;
        self.check_alive("download")?;
        Ok(read.pop().unwrap_or_default())
    }

    /// Writes `data` at byte `start` of a storage buffer (4-byte aligned start and length).
    pub(crate) fn write_aligned(
        &self,
        storage: &WgpuStorage,
        start: u64,
        data: &[u8],
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        self.queue.write_buffer(&storage.buffer, start, data);
        self.queue.submit([]);
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(execution("upload", WgpuError::from(error)));
        }
        Ok(())
    }
}

/// What the warm-up binds: the bindings each entry point uses, found by reflecting its module
/// with naga, and placeholder buffers for them.
mod warm {
    use specula_backend_api::{BackendKind, Error, Result};
    use wgpu::naga;

    use crate::kernels::{Kernel, shader_source};

    /// One binding an entry point uses.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct Used {
        pub(super) binding: u32,
        uniform: bool,
        bytes: u64,
    }

    fn build_error(kernel: Kernel, log: String) -> Error {
        Error::KernelBuild {
            backend: BackendKind::Wgpu,
            kernel: kernel.file(),
            log,
        }
    }

    /// The bindings of group 0 each of `entries` uses (as its automatic layout has them).
    pub(super) fn entry_bindings(kernel: Kernel, entries: &[String]) -> Result<Vec<Vec<Used>>> {
        let source = shader_source(kernel);
        let module = naga::front::wgsl::parse_str(&source)
            .map_err(|e| build_error(kernel, e.emit_to_string(&source)))?;
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .map_err(|e| build_error(kernel, e.emit_to_string(&source)))?;
        entries
            .iter()
            .map(|entry| {
                let index = module
                    .entry_points
                    .iter()
                    .position(|e| &e.name == entry)
                    .ok_or_else(|| build_error(kernel, format!("no entry point {entry}")))?;
                Ok(used_by(&module, info.get_entry_point(index)))
            })
            .collect()
    }

    /// The uniform and storage bindings `function` uses, with the size each needs.
    fn used_by(module: &naga::Module, function: &naga::valid::FunctionInfo) -> Vec<Used> {
        module
            .global_variables
            .iter()
            .filter(|&(handle, _)| !function[handle].is_empty())
            .filter_map(|(_, var)| {
                let binding = var.binding.as_ref()?.binding;
                let uniform = match var.space {
                    naga::AddressSpace::Uniform => true,
                    naga::AddressSpace::Storage { .. } => false,
                    _ => return None,
                };
                let size = module.types[var.ty].inner.try_size(module.to_ctx())?;
                let bytes = u64::from(size).next_multiple_of(16).max(16);
                Some(Used {
                    binding,
                    uniform,
                    bytes,
                })
            })
            .collect()
    }

    /// One zeroed buffer per used binding, of the size it needs.
    pub(super) fn placeholders(device: &wgpu::Device, used: &[Used]) -> Vec<wgpu::Buffer> {
        used.iter()
            .map(|u| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("specula warm-up"),
                    size: u.bytes,
                    usage: if u.uniform {
                        wgpu::BufferUsages::UNIFORM
                    } else {
                        wgpu::BufferUsages::STORAGE
                    },
                    mapped_at_creation: false,
                })
            })
            .collect()
    }
}

/// The wgpu storage of a buffer that passed validation on this device.
pub(crate) fn storage_of(buffer: &Buffer) -> Result<&WgpuStorage> {
    buffer.storage::<WgpuStorage>().ok_or_else(|| {
        execution(
            "buffer access",
            WgpuError::Internal("buffer storage is not wgpu memory".to_owned()),
        )
    })
}
