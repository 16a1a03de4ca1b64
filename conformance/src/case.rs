//! A conformance case: one op, its parameters, its named input tensors and (for golden cases) the
//! expected outputs. Cases are data: generated, written by hand, or loaded from a replay file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use specula_backend_api::ops::BatchDims;
use specula_backend_api::{DType, Error, Op};

pub use crate::cases::CaseParams;
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

/// One case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The name after the op in a trial name, e.g. `target_match::bs64_s6` or `f32::1x32000`.
    pub name: String,
    /// The op and its parameters.
    pub params: CaseParams,
    /// The input tensors by name (the in/out buffers' initial contents included).
    pub inputs: BTreeMap<String, HostTensor>,
    /// Hand-computed outputs (golden cases); otherwise the reference device's outputs are
    /// expected.
    pub expected: Option<BTreeMap<String, HostTensor>>,
    /// The error every device (the reference included) must reject the case with (`invalid::`
    /// cases); `None`: the case must run.
    pub expected_error: Option<ExpectedError>,
    /// The inputs hold hostile device contents that host validation would reject (negative
    /// lengths, slot rules broken): the case runs without host copies. Otherwise the host-side
    /// tensors (slot lengths, `top_p`, temperatures) are also passed as host copies, so that host
    /// validation runs as it does for a runner.
    pub device_only: bool,
    /// Inputs uploaded to another device than the one under test (a `DeviceMismatch` case).
    pub foreign: Vec<String>,
}

impl Case {
    /// A case without expected outputs.
    pub fn new(name: impl Into<String>, params: impl Into<CaseParams>) -> Self {
        Case {
            name: name.into(),
            params: params.into(),
            inputs: BTreeMap::new(),
            expected: None,
            expected_error: None,
            device_only: false,
            foreign: Vec::new(),
        }
    }

    /// Marks the inputs as device-only contents (no host copies, no host validation).
    pub fn device_only(mut self) -> Self {
        self.device_only = true;
        self
    }

    /// Makes this an `invalid::` case: every device must reject it with `error`.
    pub fn rejects(mut self, error: ExpectedError) -> Self {
        self.expected_error = Some(error);
        self
    }

    /// Uploads input `name` to another device than the one under test.
    pub fn foreign(mut self, name: &str) -> Self {
        self.foreign.push(name.to_owned());
        self
    }

    /// Adds an input tensor.
    pub fn with(mut self, name: &str, tensor: HostTensor) -> Self {
        self.inputs.insert(name.to_owned(), tensor);
        self
    }

    /// Adds an expected output (making this a golden case).
    pub fn expect(mut self, name: &str, tensor: HostTensor) -> Self {
        self.expected
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_owned(), tensor);
        self
    }

    /// The op of this case.
    pub fn op(&self) -> Op {
        self.params.op()
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
    fn mismatch(&self, tensor: &HostTensor) -> Option<String> {
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

impl Case {
    /// Checks every input tensor against the op's table ([`CaseParams::tensors`]): each declared
    /// tensor present (unless optional) with its dtype and element count, and no other tensor.
    /// `Err` names the tensor.
    pub fn check_tensors(&self) -> Result<(), String> {
        let specs = self.params.tensors();
        for spec in &specs {
            match self.inputs.get(spec.name) {
                None if spec.optional => {}
                None => return Err(format!("tensor `{}` is missing", spec.name)),
                Some(tensor) => {
                    if let Some(why) = spec.mismatch(tensor) {
                        return Err(format!("tensor `{}` {why}", spec.name));
                    }
                }
            }
        }
        match self
            .inputs
            .keys()
            .find(|n| !specs.iter().any(|s| s.name == n.as_str()))
        {
            Some(extra) => Err(format!("tensor `{extra}` is not an input of {}", self.op())),
            None => Ok(()),
        }
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
