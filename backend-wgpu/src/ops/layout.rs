//! `build_output_layout`, `gather_next_token`, `build_sampling_params`.

use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, DType, Op, Result};

use super::{Binder, element_groups, u};
use crate::WgpuDevice;
use crate::kernels::{Kernel, entry};

/// Two dispatches: the prefix sums (one invocation), then the slot of every row (parallel).
pub(crate) fn build_output_layout(
    device: &WgpuDevice,
    lens: &SlotLens<'_>,
    out: &mut LayoutOutputs<'_>,
    params: &LayoutParams<'_>,
) -> Result<()> {
    let op = Op::BuildOutputLayout;
    let dims = &params.dims;
    let mut b = Binder::new(device, op);
    b.buffer(1, lens.seq_lens_this_time)?;
    b.buffer(2, lens.seq_lens_encoder)?;
    b.buffer(3, out.seq_lens_output)?;
    b.buffer(4, out.cu_seqlens_q)?;
    b.buffer(5, out.cu_seqlens_q_output)?;
    let mut p = vec![u(dims.max_bsz), u(dims.real_bsz), u(dims.max_step_tokens)];
    p.extend(&b.offsets);
    let sums = b.dispatch(
        Kernel::BuildOutputLayout,
        entry(op, None, DType::I32),
        0,
        p,
        1,
    );

    let capacity = out.batch_id_per_token_output.len();
    let mut b = Binder::new(device, op);
    b.buffer(7, out.cu_seqlens_q_output)?;
    b.buffer(8, out.batch_id_per_token_output)?;
    let mut p = vec![u(dims.real_bsz), u(capacity)];
    p.extend(&b.offsets);
    let rows = b.dispatch(
        Kernel::BuildOutputLayout,
        entry(op, Some("rows"), DType::I32),
        6,
        p,
        element_groups(capacity),
    );
    device.gpu.run(op, vec![sums, rows])
}

/// One dispatch per chunk of input rows (one in practice): a byte-exact copy per output word.
pub(crate) fn gather_next_token(
    device: &WgpuDevice,
    inputs: &GatherInputs<'_>,
    out: &mut Buffer,
    params: &GatherParams<'_>,
    rows: usize,
) -> Result<()> {
    let op = Op::GatherNextToken;
    let dims = &params.dims;
    let es = inputs.hidden_states.dtype().size_bytes();
    let row_bytes = params.hidden * es;
    let out_bound = device.gpu.bind(op, out)?;
    let out_bytes = rows * row_bytes;
    let out_byte_off = out_bound.index as usize * if es == 8 { 4 } else { es };
    let first_word = out_byte_off / 4;
    let words = (out_byte_off + out_bytes).div_ceil(4) - first_word;
    let mut dispatches = Vec::new();
    let chunks = device
        .gpu
        .row_chunks(inputs.hidden_states, params.token_num, params.hidden);
    // With no input rows at all there is still a zero-filling pass.
    let chunks = if chunks.is_empty() {
        vec![(0, 0)]
    } else {
        chunks
    };
    for (i, &(lo, hi)) in chunks.iter().enumerate() {
        let mut b = Binder::new(device, op);
        let hidden = device
            .gpu
            .bind_rows(op, inputs.hidden_states, params.hidden, (lo, hi))?;
        let in_byte_off = hidden.index as usize * if es == 8 { 4 } else { es };
        b.bindings.push((1, hidden));
        b.buffer(2, inputs.cu_seqlens_q)?;
        b.buffer(3, inputs.lens.seq_lens_this_time)?;
        b.buffer(4, inputs.lens.seq_lens_encoder)?;
        b.buffer(5, inputs.layout.cu_seqlens_q_output)?;
        b.buffer(6, inputs.layout.batch_id_per_token_output)?;
        b.bound(7, out_bound.clone());
        let mut p = vec![
            u(row_bytes),
            u(rows),
            u(out_byte_off),
            u(out_bytes),
            u(first_word),
            u(words),
            u(in_byte_off),
            u(lo),
            u(hi),
            u32::from(i == 0),
            u(params.token_num),
            u(dims.real_bsz),
            u(dims.max_step_tokens),
            u32::from(params.is_speculative),
        ];
        // Offsets of cu_q, this_time, encoder, cu_out, batch_id (the out offset is in bytes above).
        p.extend(&b.offsets[..5]);
        dispatches.push(b.dispatch(
            Kernel::GatherNextToken,
            entry(op, None, DType::I32),
            0,
            p,
            element_groups(words),
        ));
    }
    if out_bytes == 0 {
        return Ok(());
    }
    device.gpu.run(op, dispatches)
}

/// One dispatch, one invocation per output row.
pub(crate) fn build_sampling_params(
    device: &WgpuDevice,
    inputs: &SamplingParamsInputs<'_>,
    out: &mut RowSamplingParams<'_>,
    params: &SamplingParamsParams<'_>,
    rows: usize,
) -> Result<()> {
    let op = Op::BuildSamplingParams;
    let dims = &params.dims;
    let mut b = Binder::new(device, op);
    b.buffer(1, inputs.slots.top_p)?;
    b.buffer(2, inputs.slots.top_k)?;
    b.buffer(3, inputs.slots.temperature)?;
    b.buffer(4, inputs.slots.infer_seed)?;
    b.buffer(5, inputs.lens.seq_lens_this_time)?;
    b.buffer(6, inputs.lens.seq_lens_encoder)?;
    b.buffer(7, inputs.layout.cu_seqlens_q_output)?;
    b.buffer(8, inputs.layout.batch_id_per_token_output)?;
    b.buffer(9, out.top_p)?;
    b.buffer(10, out.top_k)?;
    b.buffer(11, out.temperature)?;
    b.buffer(12, out.seed)?;
    let mut p = vec![u(rows), u(dims.real_bsz), u(dims.max_step_tokens)];
    p.extend(&b.offsets);
    let d = b.dispatch(
        Kernel::BuildSamplingParams,
        entry(op, None, DType::I32),
        0,
        p,
        element_groups(rows),
    );
    device.gpu.run(op, vec![d])
}
