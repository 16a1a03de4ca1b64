//! `gather_next_token` (`docs/semantics.md` §5.2): arguments and validation.

use super::{BatchDims, Check, HostSlotLens, OutputLayout, SlotLens};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Error, Op, Result};

/// A validated `gather_next_token`. Facts: the number of output rows (the layout's capacity when
/// speculative, `max_bsz` otherwise). Nothing to launch when it is 0.
pub type GatherNextTokenCall<'c> = Call<'c, GatherInputs<'c>, Buffer, GatherParams<'c>, usize>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = GatherNextTokenCall<'c>;

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

/// Validates `gather_next_token`.
pub(crate) fn validate<'c>(
    device: &DeviceDesc,
    inputs: &GatherInputs<'c>,
    out: &'c mut Buffer,
    params: &GatherParams<'c>,
) -> Result<GatherNextTokenCall<'c>> {
    let check = Check::new(Op::GatherNextToken, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    if params.hidden == 0 {
        return Err(Error::invalid(check.op, "hidden", ">= 1", 0));
    }
    let dtype = check.supported(inputs.hidden_states.dtype())?;
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
    let call = Call::new(*inputs, out, *params, rows);
    Ok(call
        .with_extent(rows, params.hidden)
        .launching_nothing_if(rows == 0))
}
