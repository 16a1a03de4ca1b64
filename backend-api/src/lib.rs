//! # specula-backend-api
//!
//! The backend-neutral half of Specula: the [`Device`] trait with every op of the sampling side of
//! speculative decoding, device-owned [`Buffer`]s, [`DType`]s, the typed [`Error`], and the exact
//! primitives every backend must reproduce bit for bit:
//!
//! - [`rng`]: Philox4x32-10 and the per-token seed rule;
//! - [`fixed_point`]: the integer weights, rank keys and top-p test that make sampling exact;
//! - [`slots`]: slot kinds and output-row counts of the batch layout;
//! - [`abi`]: constants shared with every kernel language.
//!
//! Host-side validation of each op lives in [`ops`], so every backend rejects the same bad
//! arguments with the same error before launching anything.

mod buffer;
mod device;
mod dtype;
mod error;
mod kind;

pub mod abi;
pub mod fixed_point;
pub mod ops;
pub mod rng;
pub mod slots;

pub use buffer::{Buffer, DeviceId};
pub use device::{Device, DeviceExt};
pub use dtype::{DType, Element, FloatElement};
pub use error::{Error, Result};
pub use kind::{BackendKind, Capabilities, DeviceInfo, Op};
pub use ops::Strategy;
