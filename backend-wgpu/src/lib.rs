//! # specula-backend-wgpu
//!
//! Every op of the Specula contract as WGSL compute shaders through `wgpu`, so a runner on any
//! Vulkan, Metal or DX12 GPU can use it; CI proves it on Mesa's lavapipe (a CPU Vulkan driver).
//! Outputs are bit-identical with the CPU reference (`specula-backend-cpu`) for every exact output,
//! and within the documented tolerance for softmax probabilities and log-probabilities.
//!
//! ## Design
//!
//! - **Portable integer arithmetic.** WGSL has no 64-bit integers without an optional feature, so
//!   every exact quantity (fixed-point weights up to 2^60, masses, Philox draws, seeds, and the
//!   128-bit products of the top-p test, `scale_draw` and the REJECTION test) is computed on `u32`
//!   limbs (`shaders/common.wgsl`). Nothing depends on `SHADER_INT64`, `SUBGROUP` or
//!   `SHADER_F16`: f16 and bf16 are stored as packed `u32` words and widened exactly from their
//!   bit patterns (subnormals included). The device requests no optional feature, so the path that
//!   runs everywhere is the one CI tests.
//! - **Sampling without a sort** (`shaders/select.wgsl`): one workgroup per row finds the top-k
//!   and top-p cut (a rank key and a take inside its group of equal keys) by a radix selection,
//!   10 key bits per pass with workgroup histograms of counts and masses, then draws with one
//!   chunked prefix scan in ascending id order (`shaders/draw.wgsl`, the same walk for SAMPLE's
//!   kept weights and REJECTION's residuals).
//! - **Any window, any size.** Buffers are windows of allocations; each binding starts at the
//!   aligned-down offset and the element offset inside it is a uniform parameter, so no window
//!   relies on the adapter's offset alignment. Matrices larger than the largest storage binding
//!   (128 MiB on lavapipe) are processed in row chunks, one dispatch per chunk in the same
//!   submission; [`MAX_BINDING_VAR`] lowers that limit to exercise the chunked paths.
//! - **A backend behind the validating front.** [`WgpuDevice`] implements
//!   [`Backend`](specula_backend_api::Backend): `backend-api` validates every call, opens its span
//!   and skips ops with nothing to do before the backend runs. The host code of each op is
//!   `src/ops/<op>.rs` beside `shaders/<op>.wgsl`, the kernel registry is generated from the op
//!   table, and each kernel's uniform parameters are one typed `kernel_args!` struct from which
//!   the WGSL struct of the same name is generated.
//! - **One submission per op.** An op records all its dispatches (one to a few) into one compute
//!   pass and submits once; nothing is read back until the caller downloads. Pipelines are compiled
//!   once per entry point (`<op>_<dtype>`) and cached, scratch buffers are kept and reused, and
//!   wgpu's validation and out-of-memory errors are captured with error scopes and returned as typed
//!   errors (`Execution` with the wgpu error as source, `KernelBuild` with the compiler log).
//!
//! Adapters are enumerated from `wgpu::Instance` (honouring `WGPU_BACKEND`); `open(n)` opens the
//! n-th adapter that can run compute shaders with enough storage bindings.

#![forbid(unsafe_code)]

mod device;
mod error;
mod external;
mod gpu;
mod kernels;
mod ops;
mod transfer;
mod words;

use std::sync::Arc;

use specula_backend_api::{BackendKind, Device, Error, Result};

pub use device::WgpuDevice;
pub use error::WgpuError;
pub use gpu::MAX_BINDING_VAR;
/// The `wgpu` this backend is built with: a runner that hands over its own device and buffers
/// ([`WgpuDevice::from_wgpu`], [`WgpuDevice::wrap_buffer`]) uses this one, so both name the same
/// version.
pub use wgpu;

/// The most storage buffers one of our kernels binds (the slot walk of `verify_draft_tokens`).
const REQUIRED_STORAGE_BUFFERS: u32 = 18;
/// The most workgroup memory one of our kernels uses (selection histograms plus per-thread
/// partials, about 18 KiB), rounded up.
const REQUIRED_WORKGROUP_STORAGE: u32 = 20 * 1024;

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BackendKind::Wgpu,
        reason: reason.into(),
    }
}

/// `Err` naming the first limit below what the kernels need.
fn check_limits(limits: &wgpu::Limits) -> std::result::Result<(), String> {
    let short = [
        (
            "max_storage_buffers_per_shader_stage",
            limits.max_storage_buffers_per_shader_stage,
            REQUIRED_STORAGE_BUFFERS,
        ),
        (
            "max_compute_invocations_per_workgroup",
            limits.max_compute_invocations_per_workgroup,
            kernels::WG,
        ),
        (
            "max_compute_workgroup_storage_size",
            limits.max_compute_workgroup_storage_size,
            REQUIRED_WORKGROUP_STORAGE,
        ),
    ]
    .into_iter()
    .find(|&(_, has, needs)| has < needs);
    match short {
        None => Ok(()),
        Some((name, has, needs)) => Err(format!(
            "the device's {name} is {has}, the kernels need {needs} (request the adapter's limits)"
        )),
    }
}

/// The adapters this backend can use, best first (Vulkan/Metal/DX12 before GL), each with its
/// limits checked.
fn usable_adapters() -> std::result::Result<Vec<wgpu::Adapter>, String> {
    let instance = std::panic::catch_unwind(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        // GL adapters rarely meet the storage-binding requirement; probing EGL only logs errors on
        // headless machines. `WGPU_BACKEND=gl` still selects them explicitly.
        if std::env::var_os("WGPU_BACKEND").is_none() {
            desc.backends = wgpu::Backends::PRIMARY;
        }
        wgpu::Instance::new(desc)
    })
    .map_err(|_| "no wgpu backend is compiled in for this platform".to_owned())?;
    let mut adapters: Vec<wgpu::Adapter> =
        pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
            .into_iter()
            .filter(|a| {
                let caps = a.get_downlevel_capabilities();
                caps.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
                    && check_limits(&a.limits()).is_ok()
            })
            .collect();
    adapters.sort_by_key(|a| u8::from(a.get_info().backend == wgpu::Backend::Gl));
    Ok(adapters)
}

/// Opens adapter `ordinal` of this backend (`wgpu:1` is the second usable adapter);
/// [`Error::Unavailable`] with the reason when it cannot.
pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(open_device(ordinal)?))
}

/// Opens adapter `ordinal` as a concrete [`WgpuDevice`].
pub fn open_device(ordinal: usize) -> Result<WgpuDevice> {
    let adapters = usable_adapters().map_err(unavailable)?;
    let count = adapters.len();
    let adapter = adapters.into_iter().nth(ordinal).ok_or_else(|| {
        unavailable(if count == 0 {
            "no adapter with compute shaders (install a Vulkan, Metal or DX12 driver; on Linux CI: mesa-vulkan-drivers)".to_owned()
        } else {
            format!("adapter {ordinal} requested, {count} usable adapter(s) found")
        })
    })?;
    let info = adapter.get_info();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("specula"),
        required_features: wgpu::Features::empty(),
        required_limits: adapter.limits(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| unavailable(format!("cannot open {}: {e}", info.name)))?;
    let gpu = gpu::Gpu::new(device, queue);
    let driver = format!("{:?} {} {}", info.backend, info.driver, info.driver_info);
    Ok(WgpuDevice::new(
        gpu,
        ordinal,
        info.name,
        driver.trim().to_owned(),
    ))
}
