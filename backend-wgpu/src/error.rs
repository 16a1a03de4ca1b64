//! The backend's own errors, carried as the source of [`specula_backend_api::Error::Execution`].

use specula_backend_api::{BackendKind, Error};

/// What went wrong inside wgpu.
#[derive(Debug, thiserror::Error)]
pub enum WgpuError {
    /// wgpu rejected a call (a validation error captured by an error scope).
    #[error("validation error: {0}")]
    Validation(String),
    /// The device ran out of memory.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// An internal error of the driver or of wgpu.
    #[error("internal error: {0}")]
    Internal(String),
    /// The device was lost (driver reset, removed adapter, fatal fault).
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// Mapping a buffer for a download failed.
    #[error("buffer mapping failed: {0}")]
    Map(String),
    /// Waiting for the device failed.
    #[error("waiting for the device failed: {0}")]
    Poll(String),
}

impl From<wgpu::Error> for WgpuError {
    fn from(error: wgpu::Error) -> Self {
        match error {
            wgpu::Error::OutOfMemory { .. } => WgpuError::OutOfMemory(error.to_string()),
            wgpu::Error::Validation { description, .. } => WgpuError::Validation(description),
            wgpu::Error::Internal { description, .. } => WgpuError::Internal(description),
        }
    }
}

/// Wraps a backend error as an [`Error::Execution`] of `what`.
pub(crate) fn execution(what: impl Into<String>, error: WgpuError) -> Error {
    Error::Execution {
        backend: BackendKind::Wgpu,
        what: what.into(),
        source: Box::new(error),
    }
}

/// An [`Error::Unsupported`] for `op`.
pub(crate) fn unsupported(op: specula_backend_api::Op, what: impl Into<String>) -> Error {
    Error::Unsupported {
        backend: BackendKind::Wgpu,
        op,
        what: what.into(),
    }
}
