//! # specula-backend-xpu-sim
//!
//! Every op of the Specula contract as OpenCL C 1.2 kernels written the way Kunlun XPU kernels are,
//! run on any OpenCL device (PoCL's CPU device in CI). FastDeploy keeps a separate XPU
//! implementation of its speculative-decoding ops, and it drifted from the GPU one (other
//! randomness, another candidate cumulative sum, a verify-window fallback the GPU removed,
//! uninitialised outputs). This backend exists so that such drift is caught: kernels with the
//! structure of XPU kernels, held by the conformance suite to the same contract as the CPU
//! reference, bit for bit on every exact output.
//!
//! ## The XPU style
//!
//! - **A launch is `clusters × cores`**: OpenCL work-groups × work-items, [`LaunchConfig`]. The
//!   default is **8 × 64**, the shape of a Kunlun XPU launch `<<<ncluster, 64>>>` on a part with 8
//!   clusters of 64 cores; `SPECULA_XPU_SIM_LAUNCH=CLUSTERSxCORES` (read by [`open`]) or
//!   [`XpuSimDevice::with_launch`] pick another (a malformed value makes [`open`] return
//!   `Unavailable` with the reason, so a CI lane cannot silently run the default). On PoCL's CPU device a cluster runs on one host
//!   thread, so the default gives both host cores work whenever a batch has two or more rows.
//! - **Clusters own rows.** Row ops (argmax, softmax, sampling, candidates, logprobs) deal rows
//!   to clusters (cluster-stride); verify deals slots; the batch bookkeeping ops run on cluster 0,
//!   as XPU batch kernels do (`if (cluster_id() != 0) return;`), or one slot per core.
//! - **Cores own slices.** Each core takes one contiguous slice of the row and stages it from
//!   global memory into its own part of local memory, `TILE` = 32 elements at a time (the XPU
//!   core's GM→LM copy), then computes partial results: a maximum, a count, a 64-bit weight sum,
//!   an argmax candidate, histogram contributions.
//! - **A second stage merges** the partials: core 0 combines the per-core partials in core order
//!   and broadcasts the result through local memory; `ngram_match` merges the proposals of every
//!   cluster in a second kernel (the global draft budget), and `accept_logprobs` packs the
//!   accepted tokens in a first kernel before the clusters score them. Every merge of an exact
//!   quantity is integer arithmetic, so no exact output depends on the launch shape; the
//!   conformance suite passes with 8x64, 2x16 and 3x5.
//! - **No barrier under a branch.** PoCL builds a work-group function by duplicating the code
//!   after each barrier reached under a branch; the kernels therefore call every row primitive
//!   unconditionally and select results afterwards (the REJECTION verifier computes the same
//!   sequence of row quantities for each output row of a slot), which keeps builds to seconds.
//!
//! ## Exactness on any OpenCL device
//!
//! - f16/bf16 are storage formats only (OpenCL C 1.2 on PoCL has no `cl_khr_fp16`): values are
//!   widened to the f32 *bit pattern* with integer code. Every decision is made on integer keys
//!   (rank keys, argmax order keys), so a device that flushes denormals cannot change a token.
//! - Sampling never sorts: the top-k and top-p thresholds are found by a 4-pass radix selection
//!   (8 bits per pass, histograms in local memory with 32-bit atomics, 64-bit weight sums kept as
//!   two words whose carries are counted), the draw by a scan of per-core partial weights.
//! - Philox4x32-10, the 64×64→128 products (`mul_hi` on `ulong`), the 128-bit compares of the
//!   top-p test and the 192-bit ones of the REJECTION acceptance test are in `kernels/common.cl`.
//! - Logits rows (`docs/semantics.md` §4b) are weighed as `specula_backend_api::logit_weights` weighs them,
//!   step for step: the logit sanitized and keyed on its bits, the row maximum a cluster
//!   collective, the row's scale one 64-by-24-bit `ulong` division, the gap one f32 subtraction
//!   (no fast-math build option, `FP_CONTRACT OFF`), the polynomial in `ulong`. Every weight is then
//!   a function of the token's rank key (at temperature 0 the maxima after the first are keyed one
//!   below), so the radix selections and draws are those of probability rows. Logits and
//!   probability rows are separate programs (`LOGITS`).
//! - `process_logits` (`docs/semantics.md` §4c) runs its float steps as single f32 operations, each result
//!   read through `sanitize_logit` as the reference does; the dense masks and steps run over core
//!   slices, core 0 then recomputes every token a sparse rule touches (bias, drafts before the row,
//!   end tokens, bad words) from its input, and the fallback and min_p use the integer keys and
//!   weights above. Over one rank's slice of sharded rows (§4d) the same kernel reads every table
//!   by global id and applies no min_p.
//! - Constants shared with Rust come from `specula_backend_api::abi` as `-D` options.
//!
//! ## Programs
//!
//! One kernel file per op, named as the op (`kernels/<op>.cl`; `common.cl` is prepended to each),
//! with its host code beside it in `src/ops/<op>.rs`. The files are embedded with `include_str!`
//! by a registry generated from the op table of `backend-api` (`for_each_op!`), so an op without
//! its kernel file does not compile. A program is built on first use per (op, entry point, dtype,
//! strategy, kind of rows, launch) and cached for the device's lifetime; a build failure is
//! [`Error::KernelBuild`](specula_backend_api::Error) with the compiler log. Entry points are
//! `<op>_<dtype>` (the two-stage ops add `accept_logprobs_pack` and `ngram_match_i32_budget`).
//!
//! Kernel parameters follow one convention: each buffer is a positional argument followed by the
//! element offset of its window, then one argument struct per kernel
//! (`specula_backend_api::kernel_args!`, e.g. `ArgmaxArgs`) passed by value, holding the scalars.
//! The kernel files do not re-type these structs: the runtime writes each one as OpenCL C from its
//! Rust declaration into the program, between `common.cl` and the op's file. Validation happens
//! once, in the front of `backend-api`, before any of this runs.
//!
//! The OpenCL library is loaded at run time (`opencl3`'s `dynamic` feature), so the crate builds
//! without OpenCL installed; [`open`] then returns `Unavailable` with the reason.
//!
//! ```no_run
//! use specula_backend_api::{Device, DeviceExt, ops::RowShape};
//! let device = specula_backend_xpu_sim::open(0)?;
//! let probs = device.upload(&[0.1f32, 0.6, 0.3])?;
//! let mut out = device.alloc::<i32>(1)?;
//! device.argmax(&probs, &mut out, &RowShape { rows: 1, vocab: 3 })?;
//! assert_eq!(device.download::<i32>(&out)?, vec![1]);
//! # Ok::<(), specula_backend_api::Error>(())
//! ```

mod device;
mod error;
mod launch;
mod ops;
mod runtime;

use std::sync::Arc;

use specula_backend_api::{Device, Result};

pub use device::XpuSimDevice;
pub use error::XpuSimError;
pub use launch::{LAUNCH_ENV, LaunchConfig, MAX_CLUSTERS, MAX_CORES};

/// Opens OpenCL device `ordinal` (counted over every platform and device type, CPU devices
/// included; `xpu-sim:0`) with the launch shape of `SPECULA_XPU_SIM_LAUNCH` (default 8x64);
/// [`specula_backend_api::Error::Unavailable`] with the reason when it cannot.
pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(XpuSimDevice::new(ordinal)?))
}
