//! The typed error every backend returns.

use crate::{BackendKind, DType, Op};

/// Result alias for the whole API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a [`Device`](crate::Device) call.
///
/// Host-side validation runs before any launch, so argument errors never leave a device in a
/// half-written state. Messages name the op and the argument, and give the expected and actual values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend cannot be used on this machine (library not found, no device).
    #[error("{backend} unavailable: {reason}")]
    Unavailable {
        /// The backend that was asked for.
        backend: BackendKind,
        /// Why it cannot be used.
        reason: String,
    },
    /// The backend does not support this op with this dtype (predicted by its capabilities).
    #[error("{op} on {backend}: unsupported {what}")]
    Unsupported {
        /// The backend.
        backend: BackendKind,
        /// The op.
        op: Op,
        /// What is unsupported, e.g. `dtype bf16`.
        what: String,
    },
    /// A scalar parameter or a host-side value is out of its range.
    #[error("{op}: invalid {arg}: expected {expected}, got {actual}")]
    InvalidArgument {
        /// The op.
        op: Op,
        /// The argument.
        arg: &'static str,
        /// What was expected.
        expected: String,
        /// What was given.
        actual: String,
    },
    /// A buffer has the wrong number of elements.
    #[error("{op}: buffer {arg} has {actual} elements, expected {expected}")]
    ShapeMismatch {
        /// The op.
        op: Op,
        /// The argument.
        arg: &'static str,
        /// Expected element count (or lower bound, see the op's docs).
        expected: usize,
        /// Actual element count.
        actual: usize,
    },
    /// A buffer has the wrong dtype.
    #[error("{op}: buffer {arg} has dtype {actual}, expected {expected}")]
    DTypeMismatch {
        /// The op.
        op: Op,
        /// The argument.
        arg: &'static str,
        /// Expected dtype(s), e.g. `i32` or `f32|f16|bf16`.
        expected: String,
        /// Actual dtype.
        actual: DType,
    },
    /// A buffer belongs to another device.
    #[error("{op}: buffer {arg} belongs to device {actual}, expected device {expected}")]
    DeviceMismatch {
        /// The op.
        op: Op,
        /// The argument.
        arg: &'static str,
        /// The device the op runs on.
        expected: u64,
        /// The buffer's device.
        actual: u64,
    },
    /// The device could not allocate a buffer.
    #[error("{backend}: out of memory allocating {requested_bytes} bytes")]
    OutOfMemory {
        /// The backend.
        backend: BackendKind,
        /// Bytes requested.
        requested_bytes: usize,
    },
    /// A kernel failed to compile; `log` holds the compiler's log.
    #[error("{backend}: kernel {kernel} failed to build")]
    KernelBuild {
        /// The backend.
        backend: BackendKind,
        /// The kernel or module name.
        kernel: String,
        /// The compiler log.
        log: String,
    },
    /// A launch or transfer failed on the device.
    #[error("{backend}: {what} failed")]
    Execution {
        /// The backend.
        backend: BackendKind,
        /// What was being done (op name, `download`, ...).
        what: String,
        /// The backend's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A name (backend, dtype, op, strategy) could not be parsed.
    #[error("unknown {what} `{input}`")]
    Parse {
        /// What was being parsed.
        what: &'static str,
        /// The input.
        input: String,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(
        op: Op,
        arg: &'static str,
        expected: impl ToString,
        actual: impl ToString,
    ) -> Self {
        Error::InvalidArgument {
            op,
            arg,
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }
}
