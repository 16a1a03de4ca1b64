//! A step's downloads in flight: the copies of every buffer's window are enqueued on the stream
//! into one block of page-locked host memory, an event marks their end, and
//! [`Device::start_download`](specula_backend_api::Device::start_download) returns at once; the
//! [`PendingDownload`]'s `wait` blocks once, on that event. From pageable memory the driver may
//! finish a copy before `cuMemcpyDtoHAsync` returns, so only page-locked memory lets the host run
//! the runner's next forward pass while the step's results travel.
//!
//! The block is reused: a device keeps the last one given back (a [`PinnedPool`]), so a decoding
//! loop allocates page-locked memory once, not once per step.

use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{CudaEvent, PinnedHostSlice};
use specula_backend_api::Result;
use specula_backend_api::backend::Download;
use specula_backend_api::transfer::{DownloadWait, PendingDownload};

use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::storage;

/// The page-locked block a device keeps between downloads (`None` until the first, or while it
/// is in flight).
pub(crate) type PinnedPool = Arc<Mutex<Option<PinnedHostSlice<u8>>>>;

/// The smallest block allocated: a step's results are a few kilobytes.
const MIN_BLOCK_BYTES: usize = 64 << 10;

impl CudaDevice {
    /// Enqueues the copy of every download's window into one page-locked block and records an
    /// event behind them; returns without waiting.
    pub(crate) fn start_pinned_download(
        &self,
        downloads: &[Download<'_>],
    ) -> Result<PendingDownload> {
        let sizes: Vec<usize> = downloads
            .iter()
            .map(|d| {
                let (start, end) = storage::window_bytes(d.src());
                end - start
            })
            .collect();
        let total: usize = sizes.iter().sum();
        if total == 0 {
            return Ok(PendingDownload::ready(vec![Vec::new(); sizes.len()]));
        }
        let mut block = self.take_block(total).map_err(api)?;
        if let Err(error) = self.enqueue_copies(downloads, &sizes, &mut block) {
            // Copies already enqueued write into the block: let them land before it is freed.
            if let Err(sync) = self.stream.synchronize() {
                tracing::warn!(%sync, "cannot synchronise after a failed download");
            }
            return Err(api(error));
        }
        let event = self
            .ctx
            .new_event(None)
            .map_err(|e| api(CudaError::driver("cuEventCreate", e)))?;
        if let Err(e) = event.record(&self.stream) {
            if let Err(sync) = self.stream.synchronize() {
                tracing::warn!(%sync, "cannot synchronise after a failed event record");
            }
            return Err(api(CudaError::driver("cuEventRecord", e)));
        }
        Ok(PendingDownload::waiting(Box::new(InFlight {
            block: Some(block),
            sizes,
            event,
            pool: Arc::downgrade(&self.pinned),
        })))
    }

    /// The device's kept block if it holds `total` bytes, else a new one (the next power of two,
    /// at least [`MIN_BLOCK_BYTES`]).
    fn take_block(&self, total: usize) -> std::result::Result<PinnedHostSlice<u8>, CudaError> {
        let kept = self.pinned.lock().map_err(|_| CudaError::Poisoned)?.take();
        if let Some(block) = kept.filter(|b| b.len() >= total) {
            return Ok(block);
        }
        let bytes = total
            .checked_next_power_of_two()
            .ok_or(CudaError::TooLarge { what: "download" })?
            .max(MIN_BLOCK_BYTES);
        // SAFETY: the block's bytes are uninitialised; every byte that is read back (the first
        // `total`, split by window) is written by a copy enqueued before the event `wait` syncs.
        // Flags 0: cacheable memory, since the host reads it (write-combined memory reads slowly).
        unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }
            .map_err(|e| CudaError::driver("cuMemHostAlloc", e))
    }

    /// Enqueues one `cuMemcpyDtoHAsync` per non-empty window, back to back in `block`.
    fn enqueue_copies(
        &self,
        downloads: &[Download<'_>],
        sizes: &[usize],
        block: &mut PinnedHostSlice<u8>,
    ) -> std::result::Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))?;
        let base = block
            .as_mut_ptr()
            .map_err(|e| CudaError::driver("cuEventSynchronize", e))?;
        let mut at = 0;
        for (download, &size) in downloads.iter().zip(sizes) {
            if size == 0 {
                continue;
            }
            let src = storage::window_ptr(download.src(), &self.stream)?;
            // SAFETY: `at + size ≤ total ≤ block.len()` (the sizes sum to `total`), so the slice
            // lies inside the block, and no other slice of it is alive; `src` is the window's
            // device address, valid for `size` bytes (the front validated the window), in this
            // context (bound above). The block outlives the copy: `InFlight` (or the error path
            // of `start_pinned_download`) syncs before it is freed or read.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(at), size) };
            // SAFETY: as above; the copy is ordered on the stream after every op enqueued before.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("cuMemcpyDtoHAsync", e))?;
            at += size;
        }
        Ok(())
    }
}

/// A driver error as the API's error of a download.
fn api(error: CudaError) -> specula_backend_api::Error {
    error.into_api("download")
}

/// The downloads of one `start_download`, on their way into a page-locked block.
struct InFlight {
    /// `None` once `wait` took it.
    block: Option<PinnedHostSlice<u8>>,
    sizes: Vec<usize>,
    /// Recorded on the stream behind the copies.
    event: CudaEvent,
    /// Where the block goes back once read (gone with the device).
    pool: Weak<Mutex<Option<PinnedHostSlice<u8>>>>,
}

impl DownloadWait for InFlight {
    fn wait(mut self: Box<Self>) -> Result<Vec<Vec<u8>>> {
        self.event
            .synchronize()
            .map_err(|e| api(CudaError::driver("cuEventSynchronize", e)))?;
        let Some(block) = self.block.take() else {
            // `wait` consumes the download, so the block is always here; were it not, the
            // front's size check would report the missing windows.
            return Ok(Vec::new());
        };
        let bytes = split(&block, &self.sizes).map_err(api);
        self.give_back(block);
        bytes
    }
}

impl InFlight {
    /// Returns the block to the device's pool, keeping the larger of the two.
    fn give_back(&self, block: PinnedHostSlice<u8>) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        if let Ok(mut kept) = pool.lock()
            && kept.as_ref().is_none_or(|k| k.len() < block.len())
        {
            *kept = Some(block);
        }
    }
}

/// Copies each window's bytes out of the block, in order.
fn split(
    block: &PinnedHostSlice<u8>,
    sizes: &[usize],
) -> std::result::Result<Vec<Vec<u8>>, CudaError> {
    let bytes = block
        .as_slice()
        .map_err(|e| CudaError::driver("cuEventSynchronize", e))?;
    let mut at = 0;
    Ok(sizes
        .iter()
        .map(|&size| {
            let window = bytes[at..at + size].to_vec();
            at += size;
            window
        })
        .collect())
}

impl Drop for InFlight {
    /// A download dropped unwaited: its copies still write into the block, so wait for them
    /// before the block is freed.
    fn drop(&mut self) {
        if self.block.is_some()
            && let Err(error) = self.event.synchronize()
        {
            tracing::warn!(%error, "cannot wait for a dropped download");
        }
    }
}
