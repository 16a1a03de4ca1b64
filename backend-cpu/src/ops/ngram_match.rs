//! `ngram_match` (`docs/semantics.md` §5.10): the n-gram draft proposer.
//!
//! For every decode slot, the last `n` generated tokens are looked up first in the prompt, then in
//! the generated history (excluding the trivial match with themselves); the tokens that follow the
//! leftmost match become drafts. The searches are independent per slot and run in parallel; the
//! global token budget is then granted sequentially in ascending slot order, which is what makes
//! the result deterministic.

use std::ops::Range;

use rayon::prelude::*;
use specula_backend_api::Result;
use specula_backend_api::ops::ngram_match::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::slots::{SlotKind, slot_kind};

use super::len_or_zero;
use crate::CpuDevice;
use specula_backend_api::host::{slice, slice_mut};

/// The leftmost start of `pattern` in `haystack`, if any.
#[inline]
fn find(haystack: &[i32], pattern: &[i32]) -> Option<usize> {
    haystack.windows(pattern.len()).position(|w| w == pattern)
}

/// The drafts of one decode slot, as a range of its `token_ids_all` row.
///
/// `row` is the slot's history row, `prompt_len` and `step` are already clamped so that
/// `prompt_len + step ≤ row.len()`, and `budget` is the most drafts the slot may take.
fn propose(
    row: &[i32],
    prompt_len: usize,
    step: usize,
    budget: usize,
    ngram: (usize, usize),
) -> Option<Range<usize>> {
    if budget == 0 {
        return None;
    }
    let (min_n, max_n) = ngram;
    let prompt = &row[..prompt_len];
    let generated = &row[prompt_len..prompt_len + step];
    // Longest pattern first; patterns longer than the history are skipped.
    for n in (min_n..=max_n.min(step)).rev() {
        let pattern = &generated[step - n..];
        // A match that ends the prompt has no following token there; fall through to the history.
        if let Some(i) = find(prompt, pattern).filter(|&i| i + n < prompt_len) {
            return Some(i + n..(i + n + budget).min(prompt_len));
        }
        // History search, ending before the pattern itself so it cannot match itself. Any match
        // starts before step − n, so at least one token follows it.
        if let Some(q) = find(&generated[..step - 1], pattern) {
            let from = prompt_len + q + n;
            return Some(from..(from + budget).min(prompt_len + step));
        }
    }
    None
}

/// Proposes drafts for every decode slot `< real_bsz` and writes them with the new
/// `seq_lens_this_time`; prefill and idle slots are untouched.
pub(crate) fn ngram_match(
    inputs: &NgramInputs<'_>,
    out: &mut NgramOutputs<'_>,
    params: &NgramParams,
) -> Result<()> {
    let dims = &params.dims;
    let s = dims.max_step_tokens;
    let max_model_len = params.max_model_len;
    let token_ids_all = slice::<i32>(inputs.token_ids_all)?;
    let prompt_lens = slice::<i32>(inputs.prompt_lens)?;
    let step_idx = slice::<i32>(inputs.step_idx)?;
    let draft_token_num = slice::<i32>(inputs.draft_token_num)?;
    let encoder = slice::<i32>(inputs.seq_lens_encoder)?;
    let max_dec_len = slice::<i32>(inputs.max_dec_len)?;
    let this_time = slice_mut::<i32>(out.seq_lens_this_time)?;
    let draft_tokens = slice_mut::<i32>(out.draft_tokens)?;

    // Decided on the incoming lengths, before any slot's `this_time` is rewritten; the slot rule of
    // the layout (a negative `seq_lens_encoder` counts as 0, so such a slot decodes).
    let decode: Vec<bool> = (0..dims.real_bsz)
        .map(|b| slot_kind(this_time[b], encoder[b]) == SlotKind::Decode)
        .collect();
    let proposals: Vec<Option<Range<usize>>> = (0..dims.real_bsz)
        .into_par_iter()
        .map(|b| {
            if !decode[b] {
                return None;
            }
            let row = token_ids_all.get(b * max_model_len..(b + 1) * max_model_len)?;
            let prompt_len = len_or_zero(prompt_lens[b]).min(max_model_len);
            let step = len_or_zero(step_idx[b]).min(max_model_len - prompt_len);
            let dec_left = (i64::from(max_dec_len[b]) - step as i64 - 1).max(0);
            let budget = len_or_zero(draft_token_num[b])
                .min(s - 1)
                .min(usize::try_from(dec_left).unwrap_or(usize::MAX));
            propose(
                row,
                prompt_len,
                step,
                budget,
                (params.min_ngram_size, params.max_ngram_size),
            )
            .map(|r| b * max_model_len + r.start..b * max_model_len + r.end)
        })
        .collect();

    // Every prefill token and one token per decode slot are fed regardless; drafts share the rest.
    let mut mandatory = 0usize;
    for b in 0..dims.real_bsz {
        if encoder[b] > 0 {
            mandatory = mandatory.saturating_add(len_or_zero(this_time[b]));
        } else if decode[b] {
            mandatory += 1;
        }
    }
    let mut remaining = params.threshold.saturating_sub(mandatory);

    for (b, proposal) in proposals.into_iter().enumerate() {
        if !decode[b] {
            continue;
        }
        let drafts = proposal.and_then(|r| token_ids_all.get(r)).unwrap_or(&[]);
        let give = drafts.len().min(remaining);
        remaining -= give;
        // give ≤ budget ≤ S − 1, so the drafts fit in positions 1 .. S of the slot.
        if let Some(dst) = draft_tokens.get_mut(b * s + 1..b * s + 1 + give) {
            dst.copy_from_slice(&drafts[..give]);
        }
        this_time[b] = 1 + give as i32;
    }
    Ok(())
}

/// Runs a validated `ngram_match` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, _) = call.parts();
    device.install(|| ngram_match(inputs, out, params))
}
