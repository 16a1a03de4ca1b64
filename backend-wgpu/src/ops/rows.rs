//! The per-row ops: `argmax`, `softmax`, `top_k_top_p_sample`, `top_p_candidates`. One workgroup
//! per row; matrices larger than one storage binding are processed in row chunks (one dispatch
//! per chunk, all in one submission).

use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, DType, Op, Result};

use super::{Binder, u};
use crate::WgpuDevice;
use crate::gpu::{Bound, Dispatch};
use crate::kernels::{Kernel, entry};

pub(crate) fn argmax(
    device: &WgpuDevice,
    dtype: DType,
    input: &Buffer,
    out: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let op = Op::Argmax;
    let mut dispatches = Vec::new();
    for chunk in device.gpu.row_chunks(input, shape.rows, shape.vocab) {
        let mut b = Binder::new(device, op);
        b.bound(1, device.gpu.bind_rows(op, input, shape.vocab, chunk)?);
        b.buffer(2, out)?;
        let mut p = vec![u(chunk.1 - chunk.0), u(shape.vocab), u(chunk.0)];
        p.extend(&b.offsets);
        dispatches.push(b.dispatch(
            Kernel::Argmax,
            entry(op, None, dtype),
            0,
            p,
            u(chunk.1 - chunk.0),
        ));
    }
    device.gpu.run(op, dispatches)
}

pub(crate) fn softmax(
    device: &WgpuDevice,
    dtype: DType,
    logits: &Buffer,
    temperature: &Buffer,
    probs: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let op = Op::Softmax;
    let mut dispatches = Vec::new();
    // Chunks must fit both the logits and the f32 output.
    let chunks = device.gpu.row_chunks(probs, shape.rows, shape.vocab);
    for chunk in chunks {
        let mut b = Binder::new(device, op);
        b.bound(1, device.gpu.bind_rows(op, logits, shape.vocab, chunk)?);
        b.buffer(2, temperature)?;
        b.bound(3, device.gpu.bind_rows(op, probs, shape.vocab, chunk)?);
        let mut p = vec![u(chunk.1 - chunk.0), u(shape.vocab), u(chunk.0)];
        p.extend(&b.offsets);
        dispatches.push(b.dispatch(
            Kernel::Softmax,
            entry(op, None, dtype),
            0,
            p,
            u(chunk.1 - chunk.0),
        ));
    }
    device.gpu.run(op, dispatches)
}

/// The dispatches sampling every row of `probs` into `tokens` (and, with `aux`, recording each
/// row's kept set and total weight for REJECTION).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sample_dispatches(
    device: &WgpuDevice,
    op: Op,
    dtype: DType,
    probs: &Buffer,
    top_k: &Buffer,
    top_p: &Buffer,
    seed: &Buffer,
    tokens: Bound,
    aux: Option<Bound>,
    shape: &RowShape,
) -> Result<Vec<Dispatch>> {
    let mut dispatches = Vec::new();
    for chunk in device.gpu.row_chunks(probs, shape.rows, shape.vocab) {
        let mut b = Binder::new(device, op);
        b.bound(1, device.gpu.bind_rows(op, probs, shape.vocab, chunk)?);
        b.buffer(2, top_k)?;
        b.buffer(3, top_p)?;
        b.buffer(4, seed)?;
        b.bound(5, tokens.clone());
        let with_aux = aux.is_some();
        match &aux {
            Some(a) => b.bound(6, a.clone()),
            None => {
                b.dummy(6);
                b.offsets.push(0);
            }
        }
        let mut p = vec![u(chunk.1 - chunk.0), u(shape.vocab), u(chunk.0)];
        p.extend(&b.offsets);
        p.push(u32::from(with_aux));
        dispatches.push(b.dispatch(
            Kernel::TopKTopPSample,
            entry(Op::TopKTopPSample, None, dtype),
            0,
            p,
            u(chunk.1 - chunk.0),
        ));
    }
    Ok(dispatches)
}

pub(crate) fn top_k_top_p_sample(
    device: &WgpuDevice,
    dtype: DType,
    inputs: &SampleInputs<'_>,
    tokens: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let op = Op::TopKTopPSample;
    let out = device.gpu.bind(op, tokens)?;
    let dispatches = sample_dispatches(
        device,
        op,
        dtype,
        inputs.probs,
        inputs.top_k,
        inputs.top_p,
        inputs.seed,
        out,
        None,
        shape,
    )?;
    device.gpu.run(op, dispatches)
}

pub(crate) fn top_p_candidates(
    device: &WgpuDevice,
    dtype: DType,
    inputs: &CandidatesInputs<'_>,
    out: &mut CandidatesOutputs<'_>,
    params: &CandidatesParams<'_>,
) -> Result<()> {
    let op = Op::TopPCandidates;
    let shape = &params.shape;
    let mut dispatches = Vec::new();
    for chunk in device.gpu.row_chunks(inputs.probs, shape.rows, shape.vocab) {
        let mut b = Binder::new(device, op);
        b.bound(
            1,
            device.gpu.bind_rows(op, inputs.probs, shape.vocab, chunk)?,
        );
        b.buffer(2, inputs.top_p)?;
        match inputs.batch_id_per_token_output {
            Some(batch_id) => b.buffer(3, batch_id)?,
            None => {
                b.dummy(3);
                b.offsets.push(0);
            }
        }
        b.buffer(4, out.ids)?;
        b.buffer(5, out.scores)?;
        b.buffer(6, out.lens)?;
        let o = &b.offsets;
        let p = vec![
            u(chunk.1 - chunk.0),
            u(shape.vocab),
            u(chunk.0),
            o[0],
            o[1],
            o[2],
            u32::from(inputs.batch_id_per_token_output.is_some()),
            o[3],
            o[4],
            o[5],
            u(params.candidates),
        ];
        dispatches.push(b.dispatch(
            Kernel::TopPCandidates,
            entry(op, None, dtype),
            0,
            p,
            u(chunk.1 - chunk.0),
        ));
    }
    device.gpu.run(op, dispatches)
}
