//! # specula-backend-cpu
//!
//! The CPU backend of Specula: every op of the contract in Rust, parallel over rows with `rayon`,
//! f16/bf16 widened exactly to f32 with `half`. It is the production fast path; the conformance
//! suite holds it, like every other backend, to the plain reference device (`specula-reference`).
//! One module per op under `src/ops`, mirroring the kernel files of the accelerated backends; the
//! sampling machinery is under `src/sampling`.
//!
//! Sampling never sorts a row. The fast path (`sampling::fast`, loops in `sampling::scan`) reads a row
//! once: exact block weights and the two largest keys of every 16-token lane group; from that
//! sample it derives a floor every kept token reaches, collects the few tokens above it and makes
//! the top-k/top-p decisions and the draw on them. Rows it cannot decide (long runs of ties,
//! `top_k > 2048`, rows far from summing to 1) go to the histogram path (`sampling::histogram`): a
//! two-level radix selection over the rank keys and one prefix scan. Both make the same integer
//! decisions. Logits rows (`docs/semantics.md` §4b) are weighed by the integer steps
//! of `logit_weights` in vectorized lanes, without a softmax (`sampling::logits`): a streaming
//! top-k pass weighs only the k best-ranked tokens; without top-k, tokens far below the top-p
//! boundary are only estimated in floats, within bounds that decide it exactly. The float ops
//! (`softmax`, `accept_logprobs`) use a vectorized `exp`. `docs/performance.md` has the
//! algorithms and the measurements.
//!
//! The hot loops are compiled for AVX-512 and AVX2 and chosen at run time (f32 rows have
//! hand-written intrinsics for both). `SPECULA_CPU_MAX_ISA=avx2` keeps an AVX-512 CPU on the AVX2
//! loops, to test or measure them there; the results are the same either way.
//!
//! ```
//! use specula_backend_api::{DeviceExt, Device, ops::{RowShape, SampleInputs, SampleParams, Scores}};
//! let cpu = specula_backend_cpu::CpuDevice::new()?;
//! let probs = cpu.upload(&[0.1f32, 0.6, 0.3])?;
//! let top_k = cpu.upload(&[0i32])?;
//! let top_p = cpu.upload(&[1.0f32])?;
//! let seed = cpu.upload(&[42u64])?;
//! let mut token = cpu.alloc::<i32>(1)?;
//! let shape = RowShape { rows: 1, vocab: 3 };
//! cpu.top_k_top_p_sample(
//!     &SampleInputs { scores: Scores::Probs(&probs), top_k: &top_k, top_p: &top_p, seed: &seed, fallback: None },
//!     &mut token,
//!     &SampleParams { shape, host_top_p: None },
//! )?;
//! let token = cpu.download::<i32>(&token)?[0];
//! assert!((0..3).contains(&token));
//! # Ok::<(), specula_backend_api::Error>(())
//! ```

mod affinity;
mod device;
mod float_math;
mod ops;
mod parallel;
mod sampling;

pub use device::CpuDevice;
