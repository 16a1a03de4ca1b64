//! `build_output_layout` (`docs/semantics.md` §5.1): arguments and validation.

use super::{BatchDims, Check, HostSlotLens, SlotLens};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `build_output_layout`. Facts: the output-row capacity (the length of
/// `batch_id_per_token_output`). Always launched: the prefix sums have `real_bsz + 1` entries
/// even when no slot is live.
pub type BuildOutputLayoutCall<'c, 'o> =
    Call<'c, SlotLens<'c>, LayoutOutputs<'o>, LayoutParams<'c>, usize>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = BuildOutputLayoutCall<'c, 'o>;

/// Parameters of `build_output_layout`.
#[derive(Clone, Copy, Debug)]
pub struct LayoutParams<'a> {
    /// The batch shape.
    pub dims: BatchDims,
    /// Host copies of the slot lengths, for validation.
    pub host: Option<HostSlotLens<'a>>,
}

/// Outputs of `build_output_layout`.
#[derive(Debug)]
pub struct LayoutOutputs<'a> {
    /// `[max_bsz]` i32: output rows per slot (0 for slots `≥ real_bsz`).
    pub seq_lens_output: &'a mut Buffer,
    /// `[real_bsz + 1]` i32: exclusive prefix sum of the packed input tokens per slot.
    pub cu_seqlens_q: &'a mut Buffer,
    /// `[real_bsz + 1]` i32: exclusive prefix sum of `seq_lens_output`; the last entry is `T_out`.
    pub cu_seqlens_q_output: &'a mut Buffer,
    /// `[rows]` i32, `rows ≥ real_bsz · S`: the slot of each output row, -1 for rows `≥ T_out`.
    pub batch_id_per_token_output: &'a mut Buffer,
}

/// Validates `build_output_layout`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    lens: &SlotLens<'c>,
    out: &'c mut LayoutOutputs<'o>,
    params: &LayoutParams<'c>,
) -> Result<BuildOutputLayoutCall<'c, 'o>> {
    let check = Check::new(Op::BuildOutputLayout, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    lens.validate(&check, dims)?;
    if let Some(host) = &params.host {
        host.validate(check.op, dims)?;
    }
    check.exact(
        "seq_lens_output",
        out.seq_lens_output,
        DType::I32,
        dims.max_bsz,
    )?;
    check.exact(
        "cu_seqlens_q",
        out.cu_seqlens_q,
        DType::I32,
        dims.real_bsz + 1,
    )?;
    check.exact(
        "cu_seqlens_q_output",
        out.cu_seqlens_q_output,
        DType::I32,
        dims.real_bsz + 1,
    )?;
    let capacity = check.at_least(
        "batch_id_per_token_output",
        out.batch_id_per_token_output,
        DType::I32,
        dims.max_output_rows(),
    )?;
    let call = Call::new(*lens, out, *params, capacity);
    Ok(call
        .with_extent(params.dims.max_bsz, 0)
        .launching_nothing_if(false))
}
