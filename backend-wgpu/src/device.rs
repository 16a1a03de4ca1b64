//! `WgpuDevice`: the [`Backend`] over one wgpu adapter. The front of `backend-api` has validated
//! every call before it reaches the methods here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use specula_backend_api::backend::{Alloc, AnyCall, Backend, DeviceDesc, Download, Upload, Write};
use specula_backend_api::{
    BackendKind, Buffer, Capabilities, DeviceInfo, PendingDownload, Result, WarmUp,
};

use crate::gpu::{Gpu, WgpuStorage, storage_of};
use crate::kernels::Kernel;
use crate::ops;

/// One opened wgpu adapter (Vulkan, Metal, DX12, or GL with compute).
#[derive(Debug)]
pub struct WgpuDevice {
    desc: DeviceDesc,
    pub(crate) gpu: Gpu,
    scratch: Mutex<HashMap<&'static str, Arc<WgpuStorage>>>,
}

impl WgpuDevice {
    pub(crate) fn new(gpu: Gpu, ordinal: usize, name: String, driver: String) -> Self {
        let info = DeviceInfo {
            kind: BackendKind::Wgpu,
            ordinal,
            name,
            driver,
        };
        // Every float dtype: f16 and bf16 are widened exactly from their bit patterns with u32
        // arithmetic, so they need no optional feature (SHADER_F16) and keep subnormals.
        let capabilities = Capabilities {
            max_buffer_bytes: Some(gpu.limits.max_buffer_size),
            // process_logits binds more storage buffers than the other kernels.
            processing: gpu.limits.max_storage_buffers_per_shader_stage
                >= crate::ops::process_logits::STORAGE_BUFFERS,
            ..Capabilities::every_op()
        };
        WgpuDevice {
            desc: DeviceDesc::new(info, capabilities),
            gpu,
            scratch: Mutex::new(HashMap::new()),
        }
    }

    /// How many compute pipelines this device has compiled so far (each entry point once, then
    /// cached): after [`Device::warm_up`](specula_backend_api::Device::warm_up) no op call adds
    /// to it.
    pub fn pipelines_built(&self) -> usize {
        self.gpu.pipelines_built()
    }

    /// A reusable internal buffer of at least `bytes` bytes for one purpose (grown on demand).
    pub(crate) fn scratch(&self, name: &'static str, bytes: u64) -> Result<Arc<WgpuStorage>> {
        let mut map = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = map.get(name)
            && s.bytes >= bytes
        {
            return Ok(s.clone());
        }
        let size = bytes.max(256).next_power_of_two();
        let storage = Arc::new(self.gpu.create_storage(size, name)?);
        map.insert(name, storage.clone());
        Ok(storage)
    }

    /// Writes `bytes` at byte `start` of `storage`, patching the covering words when the window
    /// is not 4-byte aligned.
    fn write_window(&self, storage: &WgpuStorage, start: u64, bytes: &[u8]) -> Result<()> {
        self.write_windows(&[(storage, start, bytes)])
    }

    /// Writes several windows `(storage, byte start, bytes)` in order. Storage is written in whole
    /// words: the words a window covers only in part are read first, all of them in one batched
    /// download (one wait), patched and written back.
    fn write_windows(&self, windows: &[(&WgpuStorage, u64, &[u8])]) -> Result<()> {
        let partial: Vec<_> = windows
            .iter()
            .filter(|(_, start, bytes)| !is_aligned(*start, bytes))
            .map(|&(storage, start, bytes)| {
                let (from, to) = covering_words(start, bytes.len());
                (storage, from, to - from)
            })
            .collect();
        let mut covering = match partial.is_empty() {
            true => Vec::new(),
            false => self.gpu.start_read(&partial)?.wait()?,
        }
        .into_iter();
        for &(storage, start, bytes) in windows {
            if is_aligned(start, bytes) {
                self.gpu.write_aligned(storage, start, bytes)?;
                continue;
            }
            let from = covering_words(start, bytes.len()).0;
            let mut words = covering.next().unwrap_or_default();
            let skip = (start - from) as usize;
            if let Some(window) = words.get_mut(skip..skip + bytes.len()) {
                window.copy_from_slice(bytes);
            }
            self.gpu.write_aligned(storage, from, &words)?;
        }
        Ok(())
    }
}

/// Whether a window can be written as it is: empty, or whole words at a word boundary.
fn is_aligned(start: u64, bytes: &[u8]) -> bool {
    bytes.is_empty() || (start.is_multiple_of(4) && bytes.len().is_multiple_of(4))
}

/// The byte range `from .. to` of the words covering `len` bytes at byte `start`.
fn covering_words(start: u64, len: usize) -> (u64, u64) {
    (start / 4 * 4, (start + len as u64).div_ceil(4) * 4)
}

impl Backend for WgpuDevice {
    fn desc(&self) -> &DeviceDesc {
        &self.desc
    }

    fn run_alloc_zeroed(&self, alloc: Alloc) -> Result<Buffer> {
        // wgpu zero-initialises new buffers.
        let storage = self
            .gpu
            .create_storage(alloc.bytes() as u64, "specula buffer")?;
        Ok(Buffer::from_storage(
            alloc.dtype(),
            alloc.len(),
            self.desc.id,
            Box::new(storage),
        ))
    }

    fn run_upload(&self, upload: Upload<'_>) -> Result<Buffer> {
        let buffer = self.run_alloc_zeroed(upload.alloc())?;
        let storage = storage_of(&buffer)?;
        let bytes = upload.bytes();
        let whole = bytes.len() / 4 * 4;
        self.gpu.write_aligned(storage, 0, &bytes[..whole])?;
        if whole < bytes.len() {
            // The storage is a whole number of words: the last one is padded with zeros.
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.gpu.write_aligned(storage, whole as u64, &tail)?;
        }
        Ok(buffer)
    }

    fn run_write(&self, mut write: Write<'_, '_>) -> Result<()> {
        let (dst, bytes) = write.parts();
        let start = (dst.offset() * dst.dtype().size_bytes()) as u64;
        self.write_window(storage_of(dst)?, start, bytes)
    }

    /// Every window written in order, after one batched read of the words the windows cover
    /// only in part (u8 flags, say): at most one wait however many windows.
    fn run_write_many(&self, mut writes: Vec<Write<'_, '_>>) -> Result<()> {
        let parts: Vec<_> = writes.iter_mut().map(|w| w.parts()).collect();
        let windows = parts
            .iter()
            .map(|(dst, bytes)| {
                let start = (dst.offset() * dst.dtype().size_bytes()) as u64;
                Ok((storage_of(dst)?, start, *bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        self.write_windows(&windows)
    }

    fn run_download(&self, download: Download<'_>) -> Result<Vec<u8>> {
        let src = download.src();
        let size = src.dtype().size_bytes() as u64;
        self.gpu.read(
            storage_of(src)?,
            src.offset() as u64 * size,
            src.len() as u64 * size,
        )
    }

    fn run_synchronize(&self) -> Result<()> {
        self.gpu.wait("synchronize")
    }

    /// One staging buffer for every window, one submission of the copies, one map: waited for
    /// by [`PendingDownload::wait`].
    fn run_start_download(&self, downloads: &[Download<'_>]) -> Result<PendingDownload> {
        let windows = downloads
            .iter()
            .map(|d| {
                let src = d.src();
                let size = src.dtype().size_bytes() as u64;
                let storage = storage_of(src)?;
                Ok((storage, src.offset() as u64 * size, src.len() as u64 * size))
            })
            .collect::<Result<Vec<_>>>()?;
        self.gpu.start_read(&windows)
    }

    fn run(&self, call: AnyCall<'_, '_>) -> Result<()> {
        specula_backend_api::dispatch_ops!(self, call)
    }

    /// Compiles the pipeline of every entry point of every module of the plan's ops, for each of
    /// its float dtypes, and dispatches each once without workgroups (a driver may
    /// finish compiling at the first dispatch); waits for the device.
    fn run_warm_up(&self, plan: &WarmUp) -> Result<()> {
        for kernel in plan.ops().iter().filter_map(|&op| Kernel::of(op)) {
            self.gpu
                .prepare(kernel, &kernel.entry_points(plan.dtypes()))?;
        }
        self.gpu.wait("warm_up")
    }
}
