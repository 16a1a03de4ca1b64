//! # specula-reference
//!
//! The plain reference device of Specula: every op of the contract (`docs/semantics.md`) written
//! the obvious way, so that the conformance suite has an oracle that shares no algorithm with the
//! backends it judges — the CPU backend included.
//!
//! [`ReferenceDevice`] implements [`specula_backend_api::Backend`], so it is a
//! [`Device`](specula_backend_api::Device) behind the same validating front as every backend. It is
//! meant to be *read*, and to be slow in a predictable way:
//!
//! - **single-threaded** and free of `unsafe`: one loop over rows, one over slots;
//! - **sort-based selection**: a row's token ids are sorted by (sanitized value descending, id
//!   ascending) — the rank order of the contract, literally — and top-k, top-p, the candidates and
//!   the REJECTION filter are prefixes of that order (no histogram or radix selection, no SIMD, no
//!   single-pass fast path);
//! - **its own arithmetic**: the fixed-point weights `w(p) = floor(sanitize(p) · 2^40)`, the top-p
//!   test `C · 2^24 ≥ P · W` and the draw scaling `floor(R · C / 2^64)` are computed here (in f64,
//!   where `p · 2^40` is exact, and in `u128`), not taken from `backend-api`'s `fixed_point`, so a
//!   bug there shows up as a disagreement. From `backend-api` it uses only the Philox generator and
//!   the seed rule ([`specula_backend_api::rng`], which carry the contract's known answers) and the
//!   slot rules ([`specula_backend_api::slots`]);
//! - `[rows, V]` matrices are [`ndarray`] views over the buffers, widened exactly to f32 one row
//!   at a time.
//!
//! Where `docs/semantics.md` and the CPU backend differ, this device follows
//! `docs/semantics.md`:
//!
//! - `softmax` and `accept_logprobs` compute the scaled logit as `(l − m) / T` (subtract the row
//!   maximum of the raw logits first, then divide, in f32); the special rows (+inf maximum, all
//!   −inf) are decided on the raw logits. At `T = +inf` every finite logit scales to 0 (the limit:
//!   uniform over the finite logits, as the logits weights of `docs/semantics.md` §4b), which also
//!   covers a gap `l − m` that overflows f32. Sums are f32 in 8 interleaved partial sums (entry `i`
//!   goes to partial sum `i mod 8`; the partial sums are then added in order), the order the
//!   suite's tolerance is stated for.
//! - REJECTION: an id outside `[0, V)` weighs 0 in both rows, so such a draft is rejected by the
//!   acceptance test and the correction comes from the residual with the RESIDUAL draw (SAMPLE only
//!   when `Σρ == 0`). Under `accept_all`, an out-of-vocabulary draft is not accepted by the flag and
//!   goes to the strategy's test.
//!
//! ```
//! use specula_backend_api::{DeviceExt, Device, ops::{RowShape, SampleInputs, SampleParams, Scores}};
//! let dev = specula_reference::ReferenceDevice::new();
//! let probs = dev.upload(&[0.1f32, 0.6, 0.3])?;
//! let top_k = dev.upload(&[1i32])?;
//! let top_p = dev.upload(&[1.0f32])?;
//! let seed = dev.upload(&[42u64])?;
//! let mut token = dev.alloc::<i32>(1)?;
//! dev.top_k_top_p_sample(
//!     &SampleInputs { scores: Scores::Probs(&probs), top_k: &top_k, top_p: &top_p, seed: &seed, fallback: None },
//!     &mut token,
//!     &SampleParams { shape: RowShape { rows: 1, vocab: 3 }, host_top_p: None },
//! )?;
//! assert_eq!(dev.download::<i32>(&token)?, [1]);
//! # Ok::<(), specula_backend_api::Error>(())
//! ```

#![forbid(unsafe_code)]

mod device;
#[cfg(feature = "fixtures")]
pub mod fixtures;
mod layout;
mod matrix;
mod ops;
mod shard;
mod weights;

pub use device::ReferenceDevice;
