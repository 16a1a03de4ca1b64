//! `build_output_layout`, `gather_next_token` and `build_sampling_params`.

use super::{BatchDims, Check, HostSlotLens};
use crate::{Buffer, DType, DeviceId, Error, Op, Result};

/// The per-slot lengths on device (contract §1), `[max_bsz]` i32 each.
#[derive(Clone, Copy, Debug)]
pub struct SlotLens<'a> {
    /// Tokens fed this step per slot.
    pub seq_lens_this_time: &'a Buffer,
    /// Prompt tokens of a prefill slot (> 0: prefill).
    pub seq_lens_encoder: &'a Buffer,
}

impl SlotLens<'_> {
    /// Validates both `[max_bsz]` i32 buffers.
    pub fn validate(&self, check: &Check, dims: &BatchDims) -> Result<()> {
        check.exact(
            "seq_lens_this_time",
            self.seq_lens_this_time,
            DType::I32,
            dims.max_bsz,
        )?;
        check.exact(
            "seq_lens_encoder",
            self.seq_lens_encoder,
            DType::I32,
            dims.max_bsz,
        )
    }
}

/// The output layout on device, as `build_output_layout` writes it.
#[derive(Clone, Copy, Debug)]
pub struct OutputLayout<'a> {
    /// `[real_bsz + 1]` i32: exclusive prefix sum of the output rows per slot.
    pub cu_seqlens_q_output: &'a Buffer,
    /// `[rows]` i32 with `rows ≥ real_bsz · S`: the slot of each output row, -1 for padding rows.
    pub batch_id_per_token_output: &'a Buffer,
}

impl OutputLayout<'_> {
    /// Validates the layout buffers and returns the output-row capacity.
    pub fn validate(&self, check: &Check, dims: &BatchDims) -> Result<usize> {
        check.exact(
            "cu_seqlens_q_output",
            self.cu_seqlens_q_output,
            DType::I32,
            dims.real_bsz + 1,
        )?;
        check.at_least(
            "batch_id_per_token_output",
            self.batch_id_per_token_output,
            DType::I32,
            dims.max_output_rows(),
        )
    }
}

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

/// Validates `build_output_layout`; returns the output-row capacity.
pub fn validate_build_output_layout(
    device: DeviceId,
    lens: &SlotLens<'_>,
    out: &LayoutOutputs<'_>,
    params: &LayoutParams<'_>,
) -> Result<usize> {
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
    check.at_least(
        "batch_id_per_token_output",
        out.batch_id_per_token_output,
        DType::I32,
        dims.max_output_rows(),
    )
}

/// Inputs of `gather_next_token`.
#[derive(Clone, Copy, Debug)]
pub struct GatherInputs<'a> {
    /// `[token_num, hidden]`, any dtype (the copy is bit-exact).
    pub hidden_states: &'a Buffer,
    /// `[real_bsz + 1]` i32: first packed token of each slot.
    pub cu_seqlens_q: &'a Buffer,
    /// Slot lengths.
    pub lens: SlotLens<'a>,
    /// The output layout.
    pub layout: OutputLayout<'a>,
}

/// Parameters of `gather_next_token`.
#[derive(Clone, Copy, Debug)]
pub struct GatherParams<'a> {
    /// The batch shape.
    pub dims: BatchDims,
    /// Packed input tokens (rows of `hidden_states`).
    pub token_num: usize,
    /// Row width.
    pub hidden: usize,
    /// `true`: one output row per output token (`[rows, hidden]`, rows = the layout's capacity);
    /// `false`: one row per slot (`[max_bsz, hidden]`), zeros for slots without output.
    pub is_speculative: bool,
    /// Host copies of the slot lengths, for validation.
    pub host: Option<HostSlotLens<'a>>,
}

/// Validates `gather_next_token`; returns the number of output rows.
pub fn validate_gather_next_token(
    device: DeviceId,
    inputs: &GatherInputs<'_>,
    out: &Buffer,
    params: &GatherParams<'_>,
) -> Result<usize> {
    let check = Check::new(Op::GatherNextToken, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    if params.hidden == 0 {
        return Err(Error::invalid(check.op, "hidden", ">= 1", 0));
    }
    let dtype = inputs.hidden_states.dtype();
    let in_len = check.product("hidden_states", params.token_num, params.hidden)?;
    check.exact("hidden_states", inputs.hidden_states, dtype, in_len)?;
    inputs.lens.validate(&check, dims)?;
    check.exact(
        "cu_seqlens_q",
        inputs.cu_seqlens_q,
        DType::I32,
        dims.real_bsz + 1,
    )?;
    let capacity = inputs.layout.validate(&check, dims)?;
    if let Some(host) = &params.host {
        host.validate(check.op, dims)?;
        let inputs_needed: usize = host.seq_lens_this_time[..dims.real_bsz]
            .iter()
            .map(|&t| crate::slots::slot_input_tokens(t))
            .sum();
        if inputs_needed != params.token_num {
            return Err(Error::invalid(
                check.op,
                "token_num",
                format!("sum of seq_lens_this_time = {inputs_needed}"),
                params.token_num,
            ));
        }
    }
    let rows = if params.is_speculative {
        capacity
    } else {
        dims.max_bsz
    };
    let out_len = check.product("out", rows, params.hidden)?;
    check.exact("out", out, dtype, out_len)?;
    Ok(rows)
}

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

/// Validates `build_sampling_params`; returns the number of output rows.
pub fn validate_build_sampling_params(
    device: DeviceId,
    inputs: &SamplingParamsInputs<'_>,
    out: &RowSamplingParams<'_>,
    params: &SamplingParamsParams<'_>,
) -> Result<usize> {
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
    Ok(rows)
}
