//! `accept_logprobs`: the packing dispatch, then one workgroup per packed entry (per logits chunk).

use specula_backend_api::ops::*;
use specula_backend_api::{DType, Op, Result};

use super::{Binder, u};
use crate::WgpuDevice;
use crate::kernels::{Kernel, entry};

pub(crate) fn accept_logprobs(
    device: &WgpuDevice,
    dtype: DType,
    inputs: &LogprobsInputs<'_>,
    out: &mut LogprobsOutputs<'_>,
    params: &LogprobsParams<'_>,
) -> Result<()> {
    let op = Op::AcceptLogprobs;
    let dims = &params.dims;
    let shape = &params.shape;
    let gpu = &device.gpu;
    let entries = dims.max_bsz * dims.max_step_tokens;
    let scratch = device.scratch("logprobs entries", (entries.max(1) * 8) as u64)?;

    let mut b = Binder::new(device, op);
    b.buffer(10, inputs.accept_tokens)?;
    b.buffer(11, inputs.accept_num)?;
    b.buffer(12, inputs.seq_lens_encoder)?;
    b.buffer(13, inputs.cu_seqlens_q_output)?;
    b.buffer(14, out.cu_accept)?;
    b.bindings.push((15, gpu.bind_scratch(&scratch)));
    let mut p = vec![
        u(dims.max_bsz),
        u(dims.real_bsz),
        u(dims.max_step_tokens),
        u(shape.rows),
    ];
    p.extend(&b.offsets);
    let mut dispatches = vec![b.dispatch(
        Kernel::AcceptLogprobs,
        entry(op, Some("pack"), DType::I32),
        9,
        p,
        1,
    )];

    let chunks = gpu.row_chunks(inputs.logits, shape.rows, shape.vocab);
    let chunks = if chunks.is_empty() {
        vec![(0, 0)]
    } else {
        chunks
    };
    for (i, &chunk) in chunks.iter().enumerate() {
        let mut b = Binder::new(device, op);
        b.bound(1, gpu.bind_rows(op, inputs.logits, shape.vocab, chunk)?);
        b.buffer(2, inputs.temperature)?;
        b.bindings.push((3, gpu.bind_scratch(&scratch)));
        b.buffer(4, out.token_ids)?;
        b.buffer(5, out.logprobs)?;
        b.buffer(6, out.ranks)?;
        b.buffer(7, out.top_ids)?;
        b.buffer(8, out.top_logprobs)?;
        let mut p = vec![
            u(entries),
            u(shape.vocab),
            u(params.top_k),
            u32::from(i == 0),
            u(chunk.0),
            u(chunk.1),
        ];
        p.extend(&b.offsets);
        dispatches.push(b.dispatch(
            Kernel::AcceptLogprobs,
            entry(op, None, dtype),
            0,
            p,
            u(entries),
        ));
    }
    gpu.run(op, dispatches)
}
