//! Case files: a [`Case`] saved to and loaded from a `safetensors` file, so a runner can capture a
//! real batch and replay it on every backend (`specula replay FILE`).
//!
//! The layout (documented in full, per op, in `docs/conformance.md`):
//!
//! - every input tensor under its own name (`draft_tokens`, `seq_lens_this_time`, …), with its
//!   dtype (`F32`, `F16`, `BF16`, `I32`, `U32`, `U64`, `U8`) and shape;
//! - golden outputs, when the case has them, as `expected.<output>`;
//! - tensors named `output.<backend>.<output>` (what `specula replay --out` writes next to the
//!   expected outputs) are ignored when loading, so a replay's output file is itself a case file;
//! - the safetensors `__metadata__` entry `specula` holds the JSON header
//!   `{"format": "specula-case", "version": 1, "name": …, "params": {"op": …, …}}` where `params`
//!   is [`CaseParams`] in its serde form.
//!
//! ```
//! use specula_conformance::{cases::Case, cases::argmax, replay, tensor::HostTensor};
//! let case = Case::new("f32::2x3", argmax::Params { rows: 2, vocab: 3 })
//!     .with("input", HostTensor::new(&[2, 3], &[0.1f32, 0.7, 0.2, 0.5, 0.4, 0.1]));
//! let bytes = replay::to_bytes(&case)?;
//! assert_eq!(replay::from_bytes(&bytes, "memory")?, case);
//! # Ok::<(), specula_conformance::ConformanceError>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use specula_backend_api::{Buffer, DType, Device};

use crate::cases::{Case, CaseParams};
use crate::tensor::HostTensor;
use crate::{ConformanceError, Result};

/// The `__metadata__` key holding the case header.
pub const METADATA_KEY: &str = "specula";
/// The `format` field of the header.
pub const FORMAT: &str = "specula-case";
/// The version of the layout this build writes and reads.
pub const VERSION: u32 = 1;
/// Prefix of golden output tensors.
pub const EXPECTED_PREFIX: &str = "expected.";
/// Prefix of a replay's per-backend outputs (ignored when loading).
pub const OUTPUT_PREFIX: &str = "output.";

/// The JSON header of a case file.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    name: String,
    params: CaseParams,
    /// The rejection every device must give (`"shape_mismatch:top_p"`); absent: the case runs.
    #[serde(
        rename = "expected.error",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    expected_error: Option<String>,
    /// The inputs are device-only contents: no host copies, no host validation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    device_only: bool,
    /// Inputs uploaded to another device than the one under test (`DeviceMismatch` cases).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    foreign: Vec<String>,
}

fn to_safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        DType::U8 => Dtype::U8,
    }
}

fn from_safetensors_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::U32 => DType::U32,
        Dtype::U64 => DType::U64,
        Dtype::U8 => DType::U8,
        _ => return None,
    })
}

fn format_error(source: &str, message: impl std::fmt::Display) -> ConformanceError {
    ConformanceError::Format(format!("{source}: {message}"))
}

/// Serialises `case` plus extra named tensors (e.g. a replay's per-backend outputs).
pub fn to_bytes_with(case: &Case, extra: &BTreeMap<String, HostTensor>) -> Result<Vec<u8>> {
    let header = Header {
        format: FORMAT.to_owned(),
        version: VERSION,
        name: case.name.clone(),
        params: case.params.clone(),
        expected_error: case.expected_error.as_ref().map(ToString::to_string),
        device_only: case.device_only,
        foreign: case.foreign.clone(),
    };
    let header = serde_json::to_string(&header)
        .map_err(|e| format_error(&case.name, format!("cannot serialise the header: {e}")))?;
    let mut named: Vec<(String, &HostTensor)> = case
        .inputs
        .iter()
        .map(|(name, t)| (name.clone(), t))
        .collect();
    for (name, t) in case.expected.iter().flatten() {
        named.push((format!("{EXPECTED_PREFIX}{name}"), t));
    }
    named.extend(extra.iter().map(|(name, t)| (name.clone(), t)));
    let mut views = Vec::with_capacity(named.len());
    for (name, t) in named {
        let view = TensorView::new(to_safetensors_dtype(t.dtype), t.shape.clone(), &t.bytes)
            .map_err(|e| format_error(&case.name, format!("tensor `{name}`: {e}")))?;
        views.push((name, view));
    }
    let metadata = HashMap::from([(METADATA_KEY.to_owned(), header)]);
    safetensors::serialize(views, Some(metadata))
        .map_err(|e| format_error(&case.name, format!("cannot serialise: {e}")))
}

/// Serialises `case` in the case-file format.
pub fn to_bytes(case: &Case) -> Result<Vec<u8>> {
    to_bytes_with(case, &BTreeMap::new())
}

/// Parses a case file; `source` names it in errors.
pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Case> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| format_error(source, format!("not a safetensors file ({e})")))?;
    let (_, metadata) = SafeTensors::read_metadata(bytes)
        .map_err(|e| format_error(source, format!("not a safetensors file ({e})")))?;
    let header = metadata
        .metadata()
        .as_ref()
        .and_then(|m| m.get(METADATA_KEY))
        .ok_or_else(|| {
            format_error(
                source,
                format!(
                    "not a Specula case file (no `{METADATA_KEY}` entry in the safetensors metadata)"
                ),
            )
        })?;
    let value: serde_json::Value = serde_json::from_str(header)
        .map_err(|e| format_error(source, format!("case header is not JSON ({e})")))?;
    let format = value.get("format").and_then(|v| v.as_str());
    if format != Some(FORMAT) {
        return Err(format_error(
            source,
            format!("case header has format {format:?}, expected \"{FORMAT}\""),
        ));
    }
    let version = value.get("version").and_then(|v| v.as_u64());
    if version != Some(u64::from(VERSION)) {
        return Err(format_error(
            source,
            format!(
                "case file version {}, this build reads version {VERSION}",
                version.map_or_else(|| "missing".to_owned(), |v| v.to_string())
            ),
        ));
    }
    let header: Header = serde_json::from_value(value)
        .map_err(|e| format_error(source, format!("bad case header ({e})")))?;
    let mut case = Case::new(header.name, header.params);
    case.device_only = header.device_only;
    case.foreign = header.foreign;
    if let Some(error) = &header.expected_error {
        let error = error
            .parse()
            .map_err(|e| format_error(source, format!("expected.error: {e}")))?;
        case = case.rejects(error);
    }
    for (name, view) in file.iter() {
        if name.starts_with(OUTPUT_PREFIX) {
            continue;
        }
        let dtype = from_safetensors_dtype(view.dtype()).ok_or_else(|| {
            format_error(
                source,
                format!(
                    "tensor `{name}` has dtype {:?}; case files hold F32, F16, BF16, I32, U32, U64 or U8",
                    view.dtype()
                ),
            )
        })?;
        let tensor = HostTensor::from_bytes(dtype, view.shape().to_vec(), view.data().to_vec())
            .map_err(|e| format_error(source, format!("tensor `{name}`: {e}")))?;
        match name.strip_prefix(EXPECTED_PREFIX) {
            Some(output) => case = case.expect(output, tensor),
            None => case = case.with(name, tensor),
        }
    }
    if case.inputs.is_empty() {
        return Err(format_error(source, "case file has no input tensors"));
    }
    // An `invalid::` case holds wrong tensors on purpose: the devices must reject them.
    if case.expected_error.is_none() {
        case.check_tensors()
            .map_err(|why| format_error(source, format!("{} case: {why}", case.op())))?;
    }
    Ok(case)
}

/// Saves `case` to `path`.
pub fn save(path: &Path, case: &Case) -> Result<()> {
    save_with(path, case, &BTreeMap::new())
}

/// Saves `case` plus extra named tensors to `path`.
pub fn save_with(path: &Path, case: &Case, extra: &BTreeMap<String, HostTensor>) -> Result<()> {
    let bytes = to_bytes_with(case, extra)?;
    std::fs::write(path, bytes).map_err(|source| ConformanceError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Loads a case from `path`.
pub fn load(path: &Path) -> Result<Case> {
    let bytes = std::fs::read(path).map_err(|source| ConformanceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    from_bytes(&bytes, &path.display().to_string())
}

/// Downloads a device buffer's window as a host tensor of `shape`: how a runner captures a live
/// batch (`Case::new(name, params).with("draft_tokens", download_tensor(…)?)`, then [`save`]).
pub fn download_tensor(
    device: &dyn Device,
    buffer: &Buffer,
    shape: &[usize],
) -> Result<HostTensor> {
    let bytes = device.download_bytes(buffer)?;
    HostTensor::from_bytes(buffer.dtype(), shape.to_vec(), bytes)
}

#[cfg(test)]
mod tests {
    use specula_backend_api::Op;

    use super::{from_bytes, to_bytes};
    use crate::cases::{Size, cases};

    /// The header fields of an `invalid::` case (`expected.error`, `device_only`, `foreign`) and
    /// its hostile tensors (NaN entries) survive a case file.
    #[test]
    fn every_invalid_case_round_trips_through_a_case_file() {
        for op in Op::ALL {
            let invalid = cases(op, Size::Quick)
                .into_iter()
                .filter(|c| c.expected_error.is_some());
            for case in invalid {
                let bytes = to_bytes(&case).unwrap();
                let loaded = from_bytes(&bytes, &case.name).unwrap();
                assert_eq!(loaded, case, "{op}::{}", case.name);
            }
        }
    }
}
