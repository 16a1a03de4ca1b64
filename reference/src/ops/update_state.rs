//! `update_state` (`docs/semantics.md` §5.9): the end of a step, slot by slot.

use ndarray::ArrayViewMut2;
use specula_backend_api::ops::update_state::OpCall;
use specula_backend_api::ops::{DecodeState, UpdateStateInputs, UpdateStateParams};
use specula_backend_api::rng::advance_seed;
use specula_backend_api::{Op, Result};

use crate::ReferenceDevice;
use crate::layout::{len_or_zero, saturate_i32, token_index};
use crate::matrix::{view, view_mut};
use specula_backend_api::host::{slice, slice_mut};

/// Appends each running slot's emitted tokens to its history and advances its state; stopped and
/// blocked slots, slots that emitted nothing and slots `≥ real_bsz` are untouched.
pub(crate) fn update_state(
    inputs: &UpdateStateInputs<'_>,
    state: &mut DecodeState<'_>,
    params: &UpdateStateParams,
) -> Result<()> {
    let op = Op::UpdateState;
    let dims = params.dims;
    let (s, max_model_len) = (dims.max_step_tokens, params.max_model_len);
    let accept_tokens = view::<i32>(op, inputs.accept_tokens, dims.max_bsz, s)?;
    let is_block_step = slice::<u8>(inputs.is_block_step)?;
    let prompt_lens = slice::<i32>(inputs.prompt_lens)?;
    let max_dec_len = slice::<i32>(inputs.max_dec_len)?;
    let end_tokens = slice::<i32>(inputs.end_tokens)?;

    let accept_num = slice_mut::<i32>(state.accept_num)?;
    let stop_flags = slice_mut::<u8>(state.stop_flags)?;
    let mut history: ArrayViewMut2<'_, i32> =
        view_mut(op, state.token_ids_all, dims.max_bsz, max_model_len)?;
    let step_idx = slice_mut::<i32>(state.step_idx)?;
    let infer_seed = slice_mut::<u64>(state.infer_seed)?;
    let mut draft_tokens: ArrayViewMut2<'_, i32> =
        view_mut(op, state.draft_tokens, dims.max_bsz, s)?;
    let encoder = slice_mut::<i32>(state.seq_lens_encoder)?;
    let decoder = slice_mut::<i32>(state.seq_lens_decoder)?;
    let mut counts = match state.token_counts.as_deref_mut() {
        Some(counts) => Some(view_mut::<i32>(op, counts, dims.max_bsz, params.vocab)?),
        None => None,
    };

    for b in 0..dims.real_bsz {
        if stop_flags[b] != 0 || is_block_step[b] != 0 {
            continue;
        }
        let accepted = len_or_zero(accept_num[b]).min(s);
        if accepted == 0 {
            continue;
        }
        // Room left in the history row; ≤ 0 when the row is already full.
        let prompt = len_or_zero(prompt_lens[b]).min(max_model_len);
        let step = len_or_zero(step_idx[b]);
        let room = max_model_len as i64 - prompt as i64 - step as i64;
        let n = accepted.min(usize::try_from(room).unwrap_or(0));
        let mut stop = n < accepted;
        accept_num[b] = n as i32;
        if n == 0 {
            stop_flags[b] = 1;
            continue;
        }
        let tokens: Vec<i32> = accept_tokens.row(b).iter().take(n).copied().collect();
        let start = prompt + step;
        for (k, &token) in tokens.iter().enumerate() {
            history[[b, start + k]] = token;
            if let (Some(counts), Some(v)) = (counts.as_mut(), token_index(token, params.vocab)) {
                counts[[b, v]] = counts[[b, v]].saturating_add(1);
            }
        }
        let new_step = saturate_i32(step as i64 + n as i64);
        step_idx[b] = new_step;
        infer_seed[b] = advance_seed(infer_seed[b], n as u64);
        let last = tokens[n - 1];
        draft_tokens[[b, 0]] = last;
        stop |= end_tokens.contains(&last) || new_step >= max_dec_len[b];
        if stop {
            stop_flags[b] = 1;
        }
        if encoder[b] > 0 {
            decoder[b] = saturate_i32(i64::from(decoder[b]) + i64::from(encoder[b]));
            encoder[b] = 0;
        } else {
            decoder[b] = saturate_i32(i64::from(decoder[b]) + n as i64);
        }
    }
    Ok(())
}

/// Runs a validated `update_state` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, state, params, _) = call.parts();
    update_state(inputs, state, params)
}
