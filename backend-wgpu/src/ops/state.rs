//! `update_state` and `ngram_match`.

use specula_backend_api::ops::*;
use specula_backend_api::{DType, Op, Result};

use super::{Binder, groups_for, u};
use crate::WgpuDevice;
use crate::kernels::{Kernel, SLOT_WG, entry};

/// One dispatch, one invocation per slot.
pub(crate) fn update_state(
    device: &WgpuDevice,
    inputs: &UpdateStateInputs<'_>,
    state: &mut DecodeState<'_>,
    params: &UpdateStateParams,
) -> Result<()> {
    let op = Op::UpdateState;
    let dims = &params.dims;
    let mut b = Binder::new(device, op);
    b.buffer(1, inputs.accept_tokens)?;
    b.buffer(2, inputs.is_block_step)?;
    b.buffer(3, inputs.prompt_lens)?;
    b.buffer(4, inputs.max_dec_len)?;
    b.buffer(5, inputs.end_tokens)?;
    b.buffer(6, state.accept_num)?;
    b.buffer(7, state.stop_flags)?;
    b.buffer(8, state.token_ids_all)?;
    b.buffer(9, state.step_idx)?;
    b.buffer(10, state.infer_seed)?;
    b.buffer(11, state.draft_tokens)?;
    b.buffer(12, state.seq_lens_encoder)?;
    b.buffer(13, state.seq_lens_decoder)?;
    let mut p = vec![
        u(dims.real_bsz),
        u(dims.max_step_tokens),
        u(params.max_model_len),
        u(inputs.end_tokens.len()),
    ];
    p.extend(&b.offsets);
    let d = b.dispatch(
        Kernel::UpdateState,
        entry(op, None, DType::I32),
        0,
        p,
        groups_for(dims.real_bsz, SLOT_WG),
    );
    device.gpu.run(op, vec![d])
}

/// Two dispatches: the per-slot searches (one workgroup per slot), then the budget walk.
pub(crate) fn ngram_match(
    device: &WgpuDevice,
    inputs: &NgramInputs<'_>,
    out: &mut NgramOutputs<'_>,
    params: &NgramParams,
) -> Result<()> {
    let op = Op::NgramMatch;
    let dims = &params.dims;
    let proposals = device.scratch("ngram proposals", (dims.real_bsz.max(1) * 12) as u64)?;
    let threshold = u(params.threshold);
    let mut b = Binder::new(device, op);
    b.buffer(1, inputs.token_ids_all)?;
    b.buffer(2, inputs.prompt_lens)?;
    b.buffer(3, inputs.step_idx)?;
    b.buffer(4, inputs.draft_token_num)?;
    b.buffer(5, inputs.seq_lens_encoder)?;
    b.buffer(6, inputs.max_dec_len)?;
    b.buffer(7, out.seq_lens_this_time)?;
    b.bindings.push((8, device.gpu.bind_scratch(&proposals)));
    let mut p = vec![
        u(dims.real_bsz),
        u(dims.max_step_tokens),
        u(params.max_model_len),
        u(params.min_ngram_size),
        u(params.max_ngram_size),
        threshold,
    ];
    p.extend(&b.offsets);
    // The draft_tokens offset is unused by the search.
    p.push(0);
    let search = b.dispatch(
        Kernel::NgramMatch,
        entry(op, None, DType::I32),
        0,
        p,
        u(dims.real_bsz),
    );
    let mut b = Binder::new(device, op);
    b.buffer(11, inputs.token_ids_all)?;
    b.buffer(12, inputs.seq_lens_encoder)?;
    b.bindings.push((13, device.gpu.bind_scratch(&proposals)));
    b.buffer(14, out.seq_lens_this_time)?;
    b.buffer(15, out.draft_tokens)?;
    let mut p = vec![
        u(dims.real_bsz),
        u(dims.max_step_tokens),
        u(params.max_model_len),
        threshold,
    ];
    p.extend(&b.offsets);
    let budget = b.dispatch(
        Kernel::NgramMatch,
        entry(op, Some("budget"), DType::I32),
        10,
        p,
        u32::from(dims.real_bsz > 0),
    );
    device.gpu.run(op, vec![search, budget])
}
