//! `build_sampling_params` (`docs/semantics.md` §5.3): arguments and validation.

use super::{BatchDims, Check, HostSlotLens, OutputLayout, SlotLens};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `build_sampling_params`. Facts: the number of output rows (the layout's
/// capacity). Nothing to launch when it is 0.
pub type BuildSamplingParamsCall<'c, 'o> =
    Call<'c, SamplingParamsInputs<'c>, RowSamplingParams<'o>, SamplingParamsParams<'c>, usize>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = BuildSamplingParamsCall<'c, 'o>;

/// Per-slot sampling parameters on device, `[max_bsz]` each.
#[derive(Clone, Copy, Debug)]
pub struct SlotSamplingParams<'a> {
    /// f32 `top_p` per slot.
    pub top_p: &'a Buffer,
    /// i32 `top_k` per slot (0 or ≥ V: no top-k).
    pub top_k: &'a Buffer,
    /// f32 temperature per slot.
    pub temperature: &'a Buffer,
    /// u64 `infer_seed` per slot.
    pub infer_seed: &'a Buffer,
}

/// Per-output-row sampling parameters, `[rows]` each: what `build_sampling_params` writes.
#[derive(Debug)]
pub struct RowSamplingParams<'a> {
    /// f32 `top_p` per row (1.0 for padding rows).
    pub top_p: &'a mut Buffer,
    /// i32 `top_k` per row (0 for padding rows).
    pub top_k: &'a mut Buffer,
    /// f32 temperature per row (1.0 for padding rows).
    pub temperature: &'a mut Buffer,
    /// u64 seed per row: `(infer_seed + 4·j) mod MAX_INFER_SEED` (0 for padding rows).
    pub seed: &'a mut Buffer,
}

/// Inputs of `build_sampling_params`.
#[derive(Clone, Copy, Debug)]
pub struct SamplingParamsInputs<'a> {
    /// Per-slot values.
    pub slots: SlotSamplingParams<'a>,
    /// Slot lengths.
    pub lens: SlotLens<'a>,
    /// The output layout.
    pub layout: OutputLayout<'a>,
}

/// Parameters of `build_sampling_params`.
#[derive(Clone, Copy, Debug)]
pub struct SamplingParamsParams<'a> {
    /// The batch shape.
    pub dims: BatchDims,
    /// Host copies of the slot lengths, for validation.
    pub host: Option<HostSlotLens<'a>>,
    /// Host copy of the per-slot `top_p`, for validation (each in (0, 1]).
    pub host_top_p: Option<&'a [f32]>,
    /// Host copy of the per-slot temperature, for validation (each ≥ 0).
    pub host_temperature: Option<&'a [f32]>,
}

/// Validates `build_sampling_params`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &SamplingParamsInputs<'c>,
    out: &'c mut RowSamplingParams<'o>,
    params: &SamplingParamsParams<'c>,
) -> Result<BuildSamplingParamsCall<'c, 'o>> {
    let check = Check::new(Op::BuildSamplingParams, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    let slots = &inputs.slots;
    check.exact("top_p", slots.top_p, DType::F32, dims.max_bsz)?;
    check.exact("top_k", slots.top_k, DType::I32, dims.max_bsz)?;
    check.exact("temperature", slots.temperature, DType::F32, dims.max_bsz)?;
    check.exact("infer_seed", slots.infer_seed, DType::U64, dims.max_bsz)?;
    inputs.lens.validate(&check, dims)?;
    let rows = inputs.layout.validate(&check, dims)?;
    if let Some(host) = &params.host {
        host.validate(check.op, dims)?;
    }
    check.host_top_p(params.host_top_p, dims.max_bsz)?;
    check.host_temperature(params.host_temperature, dims.max_bsz)?;
    check.exact("out top_p", out.top_p, DType::F32, rows)?;
    check.exact("out top_k", out.top_k, DType::I32, rows)?;
    check.exact("out temperature", out.temperature, DType::F32, rows)?;
    check.exact("out seed", out.seed, DType::U64, rows)?;
    let call = Call::new(*inputs, out, *params, rows);
    Ok(call.with_extent(rows, 0).launching_nothing_if(rows == 0))
}
