//! # specula-backend-api
//!
//! The backend-neutral half of Specula: the [`Device`] trait with every op of the sampling side of
//! speculative decoding, device-owned [`Buffer`]s, [`DType`]s, the typed [`Error`], and the exact
//! primitives every backend must reproduce bit for bit:
//!
//! - [`rng`]: Philox4x32-10 and the per-token seed rule;
//! - [`fixed_point`]: the integer weights, rank keys and top-p test that make sampling exact;
//! - [`shard`]: the rank keys and slice weights of sharded rows (tensor parallelism);
//! - [`slots`]: slot kinds and output-row counts of the batch layout;
//! - [`abi`]: constants shared with every kernel language.
//!
//! The layers: a runner calls [`Device`]; its one implementation, for every [`Backend`], is the
//! validating front — the host-side validation of each op ([`ops`], one file per op), the tracing
//! span and the zero-row rule, written once — which then calls the backend's `run_*` method with
//! a [`backend::Call`] that only validation can build. The ops are listed once, in the op table
//! ([`op`], [`for_each_op!`]); kernel registries and conformance cases are derived from it.

#![deny(unsafe_code)]

/// `Display` and `FromStr` through an enum's `name()` and `ALL`: for the enums whose names appear in
/// errors, spans, trial names and case files (`Op`, `BackendKind`, `DType`, `Strategy`). An unknown
/// name is [`Error::Parse`] with `what`.
macro_rules! impl_named {
    ($ty:ty, $what:literal) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = crate::Error;

            fn from_str(s: &str) -> Result<Self, crate::Error> {
                <$ty>::ALL
                    .into_iter()
                    .find(|x| x.name() == s)
                    .ok_or_else(|| crate::Error::Parse {
                        what: $what,
                        input: s.to_owned(),
                    })
            }
        }
    };
}

mod buffer;
mod call;
mod device;
mod dtype;
mod error;
mod fallback;
mod kind;
#[allow(unsafe_code)]
mod lent;

pub mod abi;
pub mod backend;
pub mod fixed_point;
pub mod host;
pub mod logit_weights;
pub mod op;
pub mod ops;
pub mod rng;
pub mod shard;
pub mod slots;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transfer;
mod warm_up;

pub use backend::Backend;
pub use buffer::{BorrowedInput, Buffer, DeviceId};
pub use device::{Device, DeviceExt};
pub use dtype::{DType, Element, FloatElement};
pub use error::{Error, Result};
/// The `half` crate of [`FloatElement`]'s `f16` and `bf16` (re-exported: a caller building
/// half-precision rows needs no dependency of its own at a matching version).
pub use half;
pub use kind::{BackendKind, Capabilities, DeviceInfo};
pub use op::{Exactness, Op, OpSpec};
pub use ops::Strategy;
pub use transfer::{DriverStats, MemoryStats, PendingDownload, WriteAt};
pub use warm_up::WarmUp;
