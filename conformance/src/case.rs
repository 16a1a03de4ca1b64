//! The vocabulary of a conformance case: its batch shape, the tensors an op takes, the errors a
//! case expects. The case itself (`cases::Case`) lives with the registry that defines its
//! parameters.

use serde::{Deserialize, Serialize};
use specula_backend_api::ops::BatchDims;
use specula_backend_api::{DType, Error};

use crate::tensor::HostTensor;

/// The batch shape, as stored in case files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dims {
    /// Request slots.
    pub max_bsz: usize,
    /// Slots described this step.
    pub real_bsz: usize,
    /// `S`, the most tokens of a decode slot per step.
    pub max_step_tokens: usize,
}

impl From<Dims> for BatchDims {
    fn from(d: Dims) -> Self {
        BatchDims::new(d.max_bsz, d.real_bsz, d.max_step_tokens)
    }
}

/// The kind of a host-side rejection, as written in case files (`shape_mismatch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// [`Error::InvalidArgument`].
    InvalidArgument,
    /// [`Error::ShapeMismatch`].
    ShapeMismatch,
    /// [`Error::DTypeMismatch`].
    DtypeMismatch,
    /// [`Error::DeviceMismatch`].
    DeviceMismatch,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::OutOfMemory`].
    OutOfMemory,
}

impl ErrorKind {
    const ALL: [ErrorKind; 6] = [
        ErrorKind::InvalidArgument,
        ErrorKind::ShapeMismatch,
        ErrorKind::DtypeMismatch,
        ErrorKind::DeviceMismatch,
        ErrorKind::Unsupported,
        ErrorKind::OutOfMemory,
    ];

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::ShapeMismatch => "shape_mismatch",
            ErrorKind::DtypeMismatch => "dtype_mismatch",
            ErrorKind::DeviceMismatch => "device_mismatch",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::OutOfMemory => "out_of_memory",
        }
    }
}

/// The rejection an `invalid::` case expects: the error's kind and the argument it names
/// (`shape_mismatch:top_p`; written so in case files as `expected.error`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExpectedError {
    /// The error variant.
    pub kind: ErrorKind,
    /// The argument the error names (empty for kinds that name none).
    pub arg: String,
}

impl ExpectedError {
    /// `kind` naming `arg`.
    pub fn new(kind: ErrorKind, arg: &str) -> Self {
        ExpectedError {
            kind,
            arg: arg.to_owned(),
        }
    }

    /// The kind and argument of a device error, if it is a host-side rejection.
    pub fn of(error: &Error) -> Option<Self> {
        let (kind, arg) = match error {
            Error::InvalidArgument { arg, .. } => (ErrorKind::InvalidArgument, *arg),
            Error::ShapeMismatch { arg, .. } => (ErrorKind::ShapeMismatch, *arg),
            Error::DTypeMismatch { arg, .. } => (ErrorKind::DtypeMismatch, *arg),
            Error::DeviceMismatch { arg, .. } => (ErrorKind::DeviceMismatch, *arg),
            Error::Unsupported { .. } => (ErrorKind::Unsupported, ""),
            Error::OutOfMemory { .. } => (ErrorKind::OutOfMemory, ""),
            _ => return None,
        };
        Some(ExpectedError::new(kind, arg))
    }
}

impl std::fmt::Display for ExpectedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.arg)
    }
}

impl std::str::FromStr for ExpectedError {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        let kind = ErrorKind::ALL
            .into_iter()
            .find(|k| k.name() == kind.trim())
            .ok_or_else(|| {
                let kinds: Vec<_> = ErrorKind::ALL.map(ErrorKind::name).to_vec();
                format!(
                    "unknown error kind `{kind}` (expected one of {})",
                    kinds.join(", ")
                )
            })?;
        Ok(ExpectedError::new(kind, arg.trim()))
    }
}

/// The dtype an input tensor of an op must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Exactly this dtype.
    Is(DType),
    /// f32, f16 or bf16.
    Float,
    /// Any dtype (a bit-exact copy).
    Any,
}

/// One input tensor of an op, as the op's table declares it: name, dtype, element count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor name (the op's argument name).
    pub name: &'static str,
    /// Its dtype.
    pub dtype: Want,
    /// Its element count, exactly.
    pub len: usize,
    /// Whether its element count is a minimum rather than exact.
    pub at_least: bool,
    /// Whether the tensor may be absent.
    pub optional: bool,
}

impl TensorSpec {
    /// `len` elements of `dtype`.
    pub fn new(name: &'static str, dtype: Want, len: usize) -> Self {
        TensorSpec {
            name,
            dtype,
            len,
            at_least: false,
            optional: false,
        }
    }

    /// `len` elements of `i32`.
    pub fn i32(name: &'static str, len: usize) -> Self {
        TensorSpec::new(name, Want::Is(DType::I32), len)
    }

    /// At least `len` elements.
    pub fn at_least(mut self) -> Self {
        self.at_least = true;
        self
    }

    /// The tensor may be absent.
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Why `tensor` does not fit this spec, if it does not.
    pub(crate) fn mismatch(&self, tensor: &HostTensor) -> Option<String> {
        let dtype_ok = match self.dtype {
            Want::Is(dtype) => tensor.dtype == dtype,
            Want::Float => tensor.dtype.is_float(),
            Want::Any => true,
        };
        if !dtype_ok {
            let want = match self.dtype {
                Want::Is(dtype) => dtype.name().to_owned(),
                Want::Float => "f32|f16|bf16".to_owned(),
                Want::Any => "any".to_owned(),
            };
            return Some(format!("has dtype {}, expected {want}", tensor.dtype));
        }
        let len = tensor.len();
        let len_ok = match self.at_least {
            true => len >= self.len,
            false => len == self.len,
        };
        (!len_ok).then(|| {
            let bound = if self.at_least { "at least " } else { "" };
            format!("has {len} elements, expected {bound}{}", self.len)
        })
    }
}

/// The tensors of a sampling op's scores: `names.0` (probabilities, `[rows, vocab]`), or with
/// `logits` the logits `names.1` and their `temperature` (`[rows]` f32).
pub fn scores_specs(
    logits: bool,
    names: (&'static str, &'static str),
    rows: usize,
    vocab: usize,
) -> Vec<TensorSpec> {
    match logits {
        false => vec![TensorSpec::new(names.0, Want::Float, rows * vocab)],
        true => vec![
            TensorSpec::new(names.1, Want::Float, rows * vocab),
            TensorSpec::new("temperature", Want::Is(DType::F32), rows),
        ],
    }
}
