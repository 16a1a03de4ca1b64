//! The backend's own error, carried as the `source` of [`specula_backend_api::Error`].

use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;
use specula_backend_api::{BackendKind, Error};

/// What can go wrong inside the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA driver call failed.
    #[error("driver call {call} failed")]
    Driver {
        /// The call (`cuLaunchKernel`, `cuMemcpyHtoDAsync`, ...).
        call: &'static str,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// An NVRTC call other than the compile itself failed.
    #[error("nvrtc call {call} failed")]
    Nvrtc {
        /// The call.
        call: &'static str,
        /// NVRTC's error code.
        #[source]
        source: NvrtcError,
    },
    /// A kernel did not compile; `log` is NVRTC's log.
    #[error("kernel {kernel} failed to compile")]
    Compile {
        /// The kernel file and instance.
        kernel: String,
        /// The compiler log.
        log: String,
    },
    /// A buffer given to this device holds another backend's storage.
    #[error("buffer storage is not CUDA memory of this device")]
    ForeignBuffer,
    /// A runner's borrowed device pointer was to be written (it is an input only).
    #[error("a wrapped device pointer is read-only")]
    BorrowedWrite,
    /// The kernel cache's lock was poisoned by a panic in another thread.
    #[error("the kernel cache is poisoned")]
    Poisoned,
    /// A call that cannot be part of a captured step (an allocation, a copy, a wait, a kernel
    /// build) was made while a step was being captured ([`crate::CudaDevice::capture_step`]).
    #[error("{what} cannot be captured")]
    NotCapturable {
        /// What was refused.
        what: &'static str,
    },
    /// An entry point that is not in its kernel file's list (a bug of this crate).
    #[error("no entry point {stem} in the kernel table")]
    UnknownKernel {
        /// The entry point's stem.
        stem: &'static str,
    },
    /// A size does not fit the launch limits of the device.
    #[error("{what} exceeds the device limit")]
    TooLarge {
        /// What was too large.
        what: &'static str,
    },
}

impl CudaError {
    /// A failed driver call.
    pub fn driver(call: &'static str, source: DriverError) -> Self {
        CudaError::Driver { call, source }
    }

    /// A failed NVRTC call.
    pub fn nvrtc(call: &'static str, source: NvrtcError) -> Self {
        CudaError::Nvrtc { call, source }
    }

    /// Maps this error into the API's error for `what` (an op name, `download`, ...).
    pub fn into_api(self, what: &str) -> Error {
        match self {
            CudaError::Compile { kernel, log } => Error::KernelBuild {
                backend: BackendKind::Cuda,
                kernel,
                log,
            },
            CudaError::Driver {
                source: DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
                ..
            } => Error::OutOfMemory {
                backend: BackendKind::Cuda,
                requested_bytes: 0,
            },
            other => Error::Execution {
                backend: BackendKind::Cuda,
                what: what.to_owned(),
                source: Box::new(other),
            },
        }
    }
}
