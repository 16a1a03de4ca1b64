//! A step's downloads in flight: the copies of every buffer's window are enqueued on the stream
//! into one block of page-locked host memory, an event marks their end, and
//! [`Device::start_download`](specula_backend_api::Device::start_download) returns at once; the
//! [`PendingDownload`]'s `wait` blocks once, on that event. From pageable memory the driver may
//! finish a copy before `cuMemcpyDtoHAsync` returns, so only page-locked memory lets the host run
//! the runner's next forward pass while the step's results travel.
//!
//! The block is reused: a device keeps the last one given back (a [`PinnedPool`](crate::driver::PinnedPool)), so a decoding
//! loop allocates page-locked memory once, not once per step.

use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::CudaEvent;
use specula_backend_api::backend::Download;
use specula_backend_api::transfer::{DownloadWait, DriverCounters, PendingDownload};
use specula_backend_api::{Op, Result};

use crate::device::CudaDevice;
use crate::driver::{Driver, PinnedBlock};
use crate::error::CudaError;
use crate::storage;

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
        let mut block = self.take_block(total).map_err(|e| self.download_error(e))?;
        if let Err(error) = self.enqueue_copies(downloads, &sizes, &mut block) {
            // Copies already enqueued write into the block: let them land before it is freed.
            if let Err(sync) = self.driver.synchronize() {
                tracing::warn!(%sync, "cannot synchronise after a failed download");
            }
            return Err(self.download_error(error));
        }
        let event = self
            .driver
            .new_event(false)
            .map_err(|e| self.download_error(e))?;
        if let Err(e) = self.driver.record(&event) {
            if let Err(sync) = self.driver.synchronize() {
                tracing::warn!(%sync, "cannot synchronise after a failed event record");
            }
            return Err(self.download_error(e));
        }
        Ok(PendingDownload::waiting(Box::new(InFlight {
            block: Some(block),
            sizes,
            event,
            counters: self.driver.counters().clone(),
            pool: Arc::downgrade(&self.pinned),
        })))
    }

    /// A download's error (a refused call while a step is captured is unsupported).
    fn download_error(&self, error: CudaError) -> specula_backend_api::Error {
        self.api_error_for(error, Op::Memory, "download")
    }

    /// The device's kept block if it holds `total` bytes, else a new one (the next power of two,
    /// at least [`MIN_BLOCK_BYTES`]).
    fn take_block(&self, total: usize) -> std::result::Result<PinnedBlock, CudaError> {
        let kept = self.pinned.lock().map_err(|_| CudaError::Poisoned)?.take();
        if let Some(block) = kept.filter(|b| b.len() >= total) {
            return Ok(block);
        }
        let bytes = total
            .checked_next_power_of_two()
            .ok_or(CudaError::TooLarge { what: "download" })?
            .max(MIN_BLOCK_BYTES);
        self.driver.alloc_pinned(bytes)
    }

    /// Enqueues one `cuMemcpyDtoHAsync` per non-empty window, back to back in `block`.
    fn enqueue_copies(
        &self,
        downloads: &[Download<'_>],
        sizes: &[usize],
        block: &mut PinnedBlock,
    ) -> std::result::Result<(), CudaError> {
        let base = block.ptr();
        let mut at = 0;
        for (download, &size) in downloads.iter().zip(sizes) {
            if size == 0 {
                continue;
            }
            let src = storage::window_ptr(download.src())?;
            // SAFETY: `at + size ≤ total ≤ block.len()` (the sizes sum to `total`), so the slice
            // lies inside the block, and no other slice of it is alive (`block` is borrowed
            // mutably).
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(at), size) };
            // SAFETY: `src` is the window's device address, valid for `size` bytes (the front
            // validated the window). The block outlives the copy: `InFlight` (or the error path
            // of `start_pinned_download`) waits before it is freed or read. The copy is ordered on
            // the stream after every op enqueued before.
            unsafe { self.driver.copy_to_host(src, dst) }?;
            at += size;
        }
        Ok(())
    }
}

/// A driver error as the API's error of a download's wait.
fn api(error: CudaError) -> specula_backend_api::Error {
    error.into_api("download")
}

/// The downloads of one `start_download`, on their way into a page-locked block.
struct InFlight {
    /// `None` once `wait` took it.
    block: Option<PinnedBlock>,
    sizes: Vec<usize>,
    /// Recorded on the stream behind the copies.
    event: CudaEvent,
    /// The device's driver counters (the wait is one synchronisation).
    counters: Arc<DriverCounters>,
    /// Where the block goes back once read (gone with the device).
    pool: Weak<Mutex<Option<PinnedBlock>>>,
}

impl DownloadWait for InFlight {
    fn wait(mut self: Box<Self>) -> Result<Vec<Vec<u8>>> {
        Driver::wait_event(&self.counters, &self.event).map_err(api)?;
        let Some(block) = self.block.take() else {
            // `wait` consumes the download, so the block is always here; were it not, the
            // front's size check would report the missing windows.
            return Ok(Vec::new());
        };
        let bytes = split(&block, &self.sizes);
        self.give_back(block);
        Ok(bytes)
    }
}

impl InFlight {
    /// Returns the block to the device's pool, keeping the larger of the two.
    fn give_back(&self, block: PinnedBlock) {
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

/// Copies each window's bytes out of the block, in order (after the event's wait).
fn split(block: &PinnedBlock, sizes: &[usize]) -> Vec<Vec<u8>> {
    // SAFETY: the block holds `block.len()` bytes, every copy into it has landed (the caller
    // waited for the event recorded behind them), and no mutable slice of it is alive.
    let bytes = unsafe { std::slice::from_raw_parts(block.ptr(), block.len()) };
    let mut at = 0;
    sizes
        .iter()
        .map(|&size| {
            let window = bytes[at..at + size].to_vec();
            at += size;
            window
        })
        .collect()
}

impl Drop for InFlight {
    /// A download dropped unwaited: its copies still write into the block, so wait for them
    /// before the block is freed.
    fn drop(&mut self) {
        if self.block.is_some()
            && let Err(error) = Driver::wait_event(&self.counters, &self.event)
        {
            tracing::warn!(%error, "cannot wait for a dropped download");
        }
    }
}
