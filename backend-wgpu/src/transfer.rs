//! The batched download of wgpu: every window copied into one staging buffer by one submission,
//! the staging buffer mapped asynchronously, and one poll when the bytes are waited for.

use std::sync::mpsc::Receiver;

use specula_backend_api::Result;
use specula_backend_api::transfer::{DownloadWait, PendingDownload};

use crate::error::{WgpuError, execution};
use crate::gpu::{Gpu, WgpuStorage};

/// A window of a storage buffer to download: the storage, the byte start and the byte count.
pub(crate) type Window<'a> = (&'a WgpuStorage, u64, u64);

/// Where a window's bytes lie in the staging buffer: its first byte and its length.
type Piece = (usize, usize);

/// The staging buffer on its way to the host.
struct StagedRead {
    device: wgpu::Device,
    staging: wgpu::Buffer,
    mapped: Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    pieces: Vec<Piece>,
}

impl Gpu {
    /// Enqueues the copy of every window into one staging buffer (behind every submitted op) and
    /// its map, without waiting.
    pub(crate) fn start_read(&self, windows: &[Window<'_>]) -> Result<PendingDownload> {
        let spans: Vec<(u64, u64)> = windows
            .iter()
            .map(|&(_, start, bytes)| (start, bytes))
            .collect();
        let (layout, size) = staging_layout(&spans);
        if size == 0 {
            return Ok(PendingDownload::ready(vec![Vec::new(); windows.len()]));
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specula batched download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("batched download"),
            });
        for (&(storage, _, _), &(from, to, at)) in windows.iter().zip(&layout) {
            if to > from {
                encoder.copy_buffer_to_buffer(&storage.buffer, from, &staging, at, to - from);
            }
        }
        self.queue.submit([encoder.finish()]);
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(execution("download", WgpuError::from(error)));
        }
        let (tx, mapped) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        let pieces = windows
            .iter()
            .zip(&layout)
            .map(|(&(_, start, bytes), &(from, _, at))| {
                ((at + start - from) as usize, bytes as usize)
            })
            .collect();
        Ok(PendingDownload::waiting(Box::new(StagedRead {
            device: self.device.clone(),
            staging,
            mapped,
            pieces,
        })))
    }
}

/// The word-aligned source range of each window `(start, bytes)` and its place in the staging
/// buffer (`(from, to, at)`), and the staging buffer's size.
fn staging_layout(spans: &[(u64, u64)]) -> (Vec<(u64, u64, u64)>, u64) {
    let mut at = 0;
    let layout = spans
        .iter()
        .map(|&(start, bytes)| {
            let (from, to) = if bytes == 0 {
                (0, 0)
            } else {
                (start / 4 * 4, (start + bytes).div_ceil(4) * 4)
            };
            let place = (from, to, at);
            at += to - from;
            place
        })
        .collect();
    (layout, at)
}

impl DownloadWait for StagedRead {
    fn wait(self: Box<Self>) -> Result<Vec<Vec<u8>>> {
        let map_error = |e: String| execution("download", WgpuError::Map(e));
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| execution("download", WgpuError::Poll(e.to_string())))?;
        match self.mapped.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(map_error(e.to_string())),
            Err(e) => return Err(map_error(e.to_string())),
        }
        let bytes = {
            let view = self
                .staging
                .get_mapped_range(..)
                .map_err(|e| map_error(e.to_string()))?;
            self.pieces
                .iter()
                .map(|&(first, len)| view[first..first + len].to_vec())
                .collect()
        };
        self.staging.unmap();
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_word_aligned_and_packed_in_order() {
        let (layout, size) = staging_layout(&[(0, 8), (5, 1), (3, 0), (2, 7)]);
        assert_eq!(layout, [(0, 8, 0), (4, 8, 8), (0, 0, 12), (0, 12, 12)]);
        assert_eq!(size, 24);
    }
}
