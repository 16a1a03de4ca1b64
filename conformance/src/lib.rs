//! # specula-conformance
//!
//! The suite that holds every Specula backend to the CPU reference, in the manner of llama.cpp's
//! `test-backend-ops`: every op on every available backend, compared with the CPU; skipped with a
//! reason where a backend is absent, never passed silently.
//!
//! - [`case`]: a case is data — an op, its parameters and named input tensors ([`tensor`]);
//! - [`exec`]: runs a case on a device with guard regions around every output;
//! - [`compare`]: exact outputs with `==`, float outputs within a documented tolerance;
//! - [`sharded`]: the cases of the sampling ops run sharded over a group of ranks
//!   (`docs/semantics.md` §4d), each rank's outputs compared with the reference's.

#![forbid(unsafe_code)]

pub mod backends;
pub mod bench;
pub mod case;
pub mod cases;
pub mod compare;
#[cfg(feature = "cuda")]
pub mod cuda_clock;
pub mod exec;
pub mod fuzz;
pub mod properties;
pub mod replay;
pub mod report;
pub mod sharded;
pub mod sharded_decode;
pub mod suite;
pub mod tensor;

/// Errors of the conformance machinery (a failed comparison is not an error: it is a result).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// A device call failed.
    #[error(transparent)]
    Device(#[from] specula_backend_api::Error),
    /// A sharded run failed (`docs/semantics.md` §4d).
    #[error(transparent)]
    Shard(#[from] specula_shard::ShardError),
    /// A decoder run failed.
    #[error(transparent)]
    Sampler(#[from] specula_sampler::SamplerError),
    /// A case or case file is malformed.
    #[error("{0}")]
    Format(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Result alias of this crate.
pub type Result<T, E = ConformanceError> = std::result::Result<T, E>;
