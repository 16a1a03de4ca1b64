//! A runner's own wgpu objects: a [`WgpuDevice`] opened on the runner's `wgpu::Device` and
//! `wgpu::Queue`, and the runner's `wgpu::Buffer`s as input buffers without a copy.

use specula_backend_api::{BorrowedInput, Buffer, DType, Device, Error, Op, Result};

use crate::device::WgpuDevice;
use crate::gpu::{Gpu, WgpuStorage};

/// An [`Error::InvalidArgument`] about the runner's buffer.
fn invalid_buffer(expected: impl ToString, actual: impl ToString) -> Error {
    Error::invalid(Op::Memory, "wgpu buffer", expected, actual)
}

impl WgpuDevice {
    /// Opens Specula on the runner's own `wgpu::Device` and `wgpu::Queue` (clones of the handles:
    /// both stay usable by the runner), so that the runner's buffers can be inputs
    /// ([`WgpuDevice::wrap_buffer`]) and Specula's work is ordered on the runner's queue. `adapter`
    /// names the device in [`DeviceInfo`](specula_backend_api::DeviceInfo).
    ///
    /// The device must have been requested with limits Specula's kernels need (18 storage
    /// buffers per stage, 20 KiB of workgroup memory, 256 invocations per workgroup: request
    /// `adapter.limits()`); else [`Error::Unavailable`] says which limit is short. Specula
    /// installs its own device-lost and uncaptured-error callbacks on the device (it reports
    /// both as typed errors at its next call), replacing the runner's.
    pub fn from_wgpu(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        adapter: &wgpu::AdapterInfo,
    ) -> Result<Self> {
        crate::check_limits(&device.limits()).map_err(crate::unavailable)?;
        let gpu = Gpu::new(device.clone(), queue.clone());
        let driver = format!(
            "{:?} {} {}",
            adapter.backend, adapter.driver, adapter.driver_info
        );
        Ok(WgpuDevice::new(
            gpu,
            0,
            format!("{} (the runner's device)", adapter.name),
            driver.trim().to_owned(),
        ))
    }

    /// The `wgpu::Device` this device runs on.
    pub fn wgpu_device(&self) -> &wgpu::Device {
        &self.gpu.device
    }

    /// The `wgpu::Queue` this device submits to.
    pub fn wgpu_queue(&self) -> &wgpu::Queue {
        &self.gpu.queue
    }

    /// The runner's `buffer`, read as `len` elements of `dtype` from its first byte, as an input
    /// buffer of this device without a copy, for as long as `buffer` is borrowed. It is an input
    /// of any op or of `Decoder::finish` (never an output), validated there like any buffer.
    ///
    /// The buffer must be on this device's `wgpu::Device` (open the device with
    /// [`WgpuDevice::from_wgpu`]), have [`wgpu::BufferUsages::STORAGE`] (and `COPY_SRC` if it is
    /// to be downloaded), and hold at least `len · dtype` bytes rounded up to a whole 4-byte word
    /// (f16 and bf16 are read as packed words); else [`Error::InvalidArgument`] names what is
    /// wrong. Specula only reads it, in the queue order of the ops that take it: the runner's
    /// writes submitted to the same queue before the call are seen, and the runner may overwrite
    /// it once the call returns (later submissions run after Specula's).
    pub fn wrap_buffer<'a>(
        &self,
        buffer: &'a wgpu::Buffer,
        dtype: DType,
        len: usize,
    ) -> Result<BorrowedInput<'a>> {
        if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(invalid_buffer(
                "STORAGE usage",
                format!("{:?}", buffer.usage()),
            ));
        }
        let needed = len
            .checked_mul(dtype.size_bytes())
            .map(|bytes| (bytes.div_ceil(4) * 4).max(4) as u64)
            .ok_or_else(|| invalid_buffer("a length whose size fits in memory", len))?;
        if buffer.size() < needed {
            return Err(invalid_buffer(
                format!("at least {needed} bytes ({len} × {dtype}, whole words)"),
                format!("{} bytes", buffer.size()),
            ));
        }
        self.check_same_device(buffer)?;
        let storage = WgpuStorage {
            buffer: buffer.clone(),
            bytes: buffer.size() / 4 * 4,
        };
        let wrapped = Buffer::from_storage(dtype, len, self.id(), Box::new(storage));
        Ok(BorrowedInput::new(wrapped, true))
    }

    /// [`Error::InvalidArgument`] unless `buffer` is on this device's `wgpu::Device`: wgpu exposes
    /// no buffer's device, so a one-word bind group of it is made on ours, which wgpu refuses
    /// for a buffer of another device.
    fn check_same_device(&self, buffer: &wgpu::Buffer) -> Result<()> {
        let device = &self.gpu.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("specula device check"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: true },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }],
        });
        let _group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("specula device check"),
            layout: &layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(4),
                }),
            }],
        });
        match pollster::block_on(scope.pop()) {
            None => Ok(()),
            Some(error) => Err(invalid_buffer(
                "a buffer of this device's wgpu::Device",
                format!("a buffer wgpu cannot bind here ({error})"),
            )),
        }
    }
}
