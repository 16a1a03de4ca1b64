//! # specula-backend-cuda
//!
//! NVIDIA GPUs through [`cudarc`]: every op of the Specula contract as CUDA kernels, compiled by
//! NVRTC at first use for the device's architecture and cached per device, with the same exact
//! integer semantics as the CPU reference (`specula-backend-cpu`).
//!
//! ## Loading
//!
//! cudarc is built with dynamic loading and pinned CUDA 12.8 bindings, so this crate builds on a
//! machine with no CUDA at all. At run time [`open`] probes before touching anything: libcuda
//! (`is_culib_present`, since cudarc's loader panics without it), the driver version (12.0 or
//! newer), libnvrtc and the NVRTC symbols used here, the device count, then the context. Anything
//! missing is [`Error::Unavailable`](specula_backend_api::Error::Unavailable) with the reason; nothing panics.
//!
//! ## Kernels
//!
//! One file per op under `kernels/` plus `common.cuh` (Philox4x32-10, the exact 64×64→128-bit
//! helpers on `__umul64hi`, fixed-point weights, block scans) and `select.cuh` (the rank-order
//! selection), embedded with `include_str!` ([`kernels`]). Constants come from
//! `specula_backend_api::abi` as `-D` defines. A module is compiled once per (file, element types)
//! and device, to a CUBIN for the device's own `sm_XY` (or PTX for the newest older architecture
//! NVRTC knows), and an NVRTC error is [`Error::KernelBuild`](specula_backend_api::Error::KernelBuild) with the compiler's log. The
//! `nvrtc-check` binary compiles every instance with the same options on a machine without a GPU.
//!
//! ## Sampling without sorting
//!
//! `top_k_top_p_sample`, `top_p_candidates`, REJECTION's filter and the logprob top-K never sort
//! a row. The kept set is a prefix of the rank order (key descending, id ascending) described by a
//! threshold key and a `take` count inside its group of equal keys; it is found by a three-pass
//! radix selection (11/11/10-bit digits) whose histograms hold counts and exact u64 masses, and
//! the token by one id-order prefix scan against `t = floor(R · C / 2^64)`. Rows are read with
//! 16-byte vector loads when aligned. Small batches of a large vocabulary split each row over
//! several cooperating blocks (launched cooperatively, with a grid barrier between passes); large
//! batches use a block per row. `verify_draft_tokens` runs one thread per slot (GREEDY,
//! TARGET_MATCH, TOPP) or one block per slot after a per-row pre-pass (REJECTION), on the device,
//! without host round-trips; every op of a step is enqueued on one stream, and only downloads
//! synchronise.
//!
//! ## The host path of an op
//!
//! After its warm-up an op makes no driver call but its launches (counted:
//! [`Device::memory_stats`]'s `driver`, by the one
//! module that calls the driver to allocate, copy, wait or launch). Its scratch comes from a
//! per-device arena grown on demand and reused, never zeroed per call (the kernels write what
//! they read; a split row's grid barrier keeps its own two words valid from launch to launch);
//! its function from a table filled once per entry point; its buffers' addresses were read when
//! they were allocated; its small parameters travel inside the kernel's one argument struct.
//! Writes and uploads enqueue their copy without waiting (the driver stages pageable memory
//! before it returns); only downloads and `synchronize` wait. A step whose shapes repeat can be
//! recorded as one CUDA graph and replayed with one launch ([`CudaDevice::capture_step`]). For
//! benchmarks, [`KernelTimer`] measures device time with CUDA events and
//! [`CudaDevice::read_floor`] reads a buffer once with a kernel that does nothing else.
//!
//! ## Sampling from logits
//!
//! The sampling ops and REJECTION also take logits rows with a per-row temperature (`docs/semantics.md` §4b):
//! a first pass finds the row maximum (across the blocks of a split row), the temperature gives the
//! row's scale with one integer division, and every token's rank key and integer weight then come
//! from its logit as `specula_backend_api::logit_weights` computes them (one f32 subtraction, a
//! 32×32-bit product and a fixed-point polynomial), so the selections above run unchanged on
//! them. REJECTION's acceptance test on logits rows is exact in 192 bits (its products reach
//! 2^133), and its residual is scaled by `2^max(0, bitlength(Wp) + bitlength(Wq) − 60)`.
//!
//! ## Windows and hostile contents
//!
//! Kernels receive the device address of each buffer's *window*, so offsets are honoured by
//! construction. Every index read from a buffer is range-checked on the device with the fallbacks
//! of the contract, exactly as in the CPU reference. [`CudaDevice`] implements
//! [`Backend`](specula_backend_api::backend::Backend): host-side validation, the tracing span and
//! the zero-row rule are done once, by the validating front of `specula-backend-api`, before an op
//! of this crate runs (one host file per op, `src/ops/<op>.rs`, beside `kernels/<op>.cu`).

pub mod kernels;
pub mod launch;
pub mod nvrtc;

mod arena;
mod args;
mod capture;
mod device;
mod download;
mod driver;
mod error;
mod external;
mod ops;
mod storage;
mod timing;

pub use capture::CapturedStep;
/// The `cudarc` this backend is built with: a runner that hands over its own stream and device
/// pointers ([`CudaDevice::from_stream`], [`CudaDevice::wrap_device_ptr`]) uses this one, so both
/// name the same version.
pub use cudarc;
pub use device::CudaDevice;
pub use error::CudaError;
pub use timing::KernelTimer;

use std::sync::Arc;

use specula_backend_api::{Device, Result};

/// Opens device `ordinal` of this backend; [`Error::Unavailable`](specula_backend_api::Error::Unavailable) with the reason when it cannot
/// (no driver, no NVRTC, no such device).
///
/// ```
/// match specula_backend_cuda::open(0) {
///     Ok(device) => println!("{}", device.info().name),
///     Err(specula_backend_api::Error::Unavailable { reason, .. }) => println!("skipped: {reason}"),
///     Err(other) => panic!("{other}"),
/// }
/// ```
pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    let device: Arc<dyn Device> = Arc::new(CudaDevice::new(ordinal)?);
    Ok(device)
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_without_a_gpu_is_unavailable_with_a_reason() {
        // On a machine with a GPU this opens it; elsewhere it must be a clean Unavailable.
        match super::open(0) {
            Ok(device) => assert_eq!(device.info().kind, specula_backend_api::BackendKind::Cuda),
            Err(specula_backend_api::Error::Unavailable { reason, .. }) => {
                assert!(!reason.is_empty())
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    #[test]
    fn a_missing_ordinal_is_unavailable() {
        match super::open(4096) {
            Err(specula_backend_api::Error::Unavailable { reason, .. }) => {
                assert!(!reason.is_empty())
            }
            Ok(_) => panic!("device 4096 cannot exist"),
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}
