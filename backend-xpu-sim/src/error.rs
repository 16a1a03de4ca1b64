//! This backend's own errors, carried as the source of [`specula_backend_api::Error`].

use opencl3::error_codes::ClError;
use specula_backend_api::{BackendKind, Error};

/// What went wrong inside the OpenCL runtime.
#[derive(Debug, thiserror::Error)]
pub enum XpuSimError {
    /// An OpenCL call returned an error code.
    #[error("{call}: {source}")]
    Cl {
        /// The OpenCL call.
        call: &'static str,
        /// The error code.
        #[source]
        source: ClError,
    },
    /// A buffer carries a device id of this backend but storage of another backend.
    #[error("buffer storage is not an OpenCL buffer")]
    ForeignStorage,
    /// The program cache lock was poisoned by a panic in another thread.
    #[error("the program cache lock is poisoned")]
    Poisoned,
    /// A program built without the kernel the host asked for.
    #[error("kernel {0} missing from its program")]
    MissingKernel(String),
}

impl XpuSimError {
    /// Wraps an OpenCL error code of `call`.
    pub(crate) fn cl(call: &'static str) -> impl FnOnce(ClError) -> XpuSimError {
        move |source| XpuSimError::Cl { call, source }
    }

    /// As an execution error of `what` (an op or memory operation name).
    pub(crate) fn into_execution(self, what: &str) -> Error {
        Error::Execution {
            backend: BackendKind::XpuSim,
            what: what.to_owned(),
            source: Box::new(self),
        }
    }
}
