//! `update_state` (`docs/semantics.md` §5.9): the end of a step for every running slot.
//!
//! Appends the emitted tokens to the slot's history, advances `step_idx` and the seed (by 4 per
//! emitted token, which keeps speculative and plain decoding on the same seeds), records the last
//! token as the next step's input, sets the stop flag, and turns a prefill slot into a decode slot.
//! The work is O(max_bsz · S) scalar bookkeeping, so it runs sequentially.

use specula_backend_api::Result;
use specula_backend_api::ops::update_state::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::rng::advance_seed;

use super::len_or_zero;
use crate::CpuDevice;
use specula_backend_api::host::{slice, slice_mut};

/// Saturating i64 → i32, for sums of untrusted lengths.
#[inline]
fn clamp_i32(value: i64) -> i32 {
    value.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// What slot `b` counted: its row of the count table after counting, and the tokens.
type OnCounted<'f> = &'f mut dyn FnMut(usize, &[i32], &[i32]);

/// Applies the accepted tokens of slots `0 .. real_bsz` to the decode state; stopped and blocked
/// slots, slots with nothing accepted and slots `≥ real_bsz` are left untouched. Each slot's
/// counted tokens are also handed to `on_counted`.
pub(crate) fn update_state(
    inputs: &UpdateStateInputs<'_>,
    state: &mut DecodeState<'_>,
    params: &UpdateStateParams,
    on_counted: OnCounted<'_>,
) -> Result<()> {
    let dims = &params.dims;
    let s = dims.max_step_tokens;
    let max_model_len = params.max_model_len;
    let accept_tokens = slice::<i32>(inputs.accept_tokens)?;
    let is_block_step = slice::<u8>(inputs.is_block_step)?;
    let prompt_lens = slice::<i32>(inputs.prompt_lens)?;
    let max_dec_len = slice::<i32>(inputs.max_dec_len)?;
    let end_tokens = slice::<i32>(inputs.end_tokens)?;

    let accept_num = slice_mut::<i32>(state.accept_num)?;
    let stop_flags = slice_mut::<u8>(state.stop_flags)?;
    let token_ids_all = slice_mut::<i32>(state.token_ids_all)?;
    let step_idx = slice_mut::<i32>(state.step_idx)?;
    let infer_seed = slice_mut::<u64>(state.infer_seed)?;
    let draft_tokens = slice_mut::<i32>(state.draft_tokens)?;
    let encoder = slice_mut::<i32>(state.seq_lens_encoder)?;
    let decoder = slice_mut::<i32>(state.seq_lens_decoder)?;
    let mut counts = state
        .token_counts
        .as_deref_mut()
        .map(slice_mut::<i32>)
        .transpose()?;

    for b in 0..dims.real_bsz {
        if stop_flags[b] != 0 || is_block_step[b] != 0 {
            continue;
        }
        let mut n = len_or_zero(accept_num[b]).min(s);
        if n == 0 {
            continue;
        }
        let prompt = len_or_zero(prompt_lens[b]).min(max_model_len);
        let step = len_or_zero(step_idx[b]);
        // Room left in the history row; may be ≤ 0 when step_idx is already past it.
        let room = max_model_len as i64 - prompt as i64 - step as i64;
        let mut stop = false;
        if n as i64 > room {
            n = room.max(0) as usize;
            stop = true;
        }
        accept_num[b] = n as i32;
        if n == 0 {
            stop_flags[b] = 1;
            continue;
        }

        let tokens = &accept_tokens[b * s..b * s + n];
        // prompt + step + n ≤ max_model_len by the room clamp, so the window is inside row b.
        let start = b * max_model_len + prompt + step;
        if let Some(dst) = token_ids_all.get_mut(start..start + n) {
            dst.copy_from_slice(tokens);
        }
        if let Some(counts) = counts.as_deref_mut() {
            let row = &mut counts[b * params.vocab..(b + 1) * params.vocab];
            count_tokens(row, tokens);
            on_counted(b, row, tokens);
        }
        let new_step = clamp_i32(step as i64 + n as i64);
        step_idx[b] = new_step;
        infer_seed[b] = advance_seed(infer_seed[b], n as u64);
        let last = tokens[n - 1];
        draft_tokens[b * s] = last;
        if end_tokens.contains(&last) || new_step >= max_dec_len[b] {
            stop = true;
        }
        if stop {
            stop_flags[b] = 1;
        }
        if encoder[b] > 0 {
            decoder[b] = decoder[b].saturating_add(encoder[b]);
            encoder[b] = 0;
        } else {
            decoder[b] = clamp_i32(i64::from(decoder[b]) + n as i64);
        }
    }
    Ok(())
}

/// Adds each appended token in the vocabulary to its slot's count (`docs/semantics.md` §4c),
/// saturating at `i32::MAX`.
fn count_tokens(counts: &mut [i32], tokens: &[i32]) {
    for &t in tokens {
        if let Some(c) = super::token_index(t, counts.len()).map(|v| &mut counts[v]) {
            *c = c.saturating_add(1);
        }
    }
}

/// Runs a validated `update_state` call (the front has checked every argument).
/// The device's counted bits of the count table follow the tokens counted.
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, state, params, _) = call.parts();
    let tables = device.counted_tables();
    let mut update = (state.token_counts.as_deref()).map(|t| tables.start_update(t, params.vocab));
    update_state(inputs, state, params, &mut |b, counts, tokens| {
        if let Some(update) = update.as_mut() {
            update.counted(b, counts, tokens);
        }
    })?;
    if let (Some(update), Some(table)) = (update, state.token_counts.as_deref()) {
        update.finish(table);
    }
    Ok(())
}
