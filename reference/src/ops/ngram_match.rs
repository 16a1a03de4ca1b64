//! `ngram_match` (`docs/semantics.md` §5.10): n-gram lookup in the prompt, then in
//! the generated history, and a global budget granted in slot order.

use ndarray::ArrayViewMut2;
use specula_backend_api::ops::ngram_match::OpCall;
use specula_backend_api::ops::{NgramInputs, NgramOutputs, NgramParams};
use specula_backend_api::slots::{SlotKind, slot_kind};
use specula_backend_api::{Op, Result};

use crate::ReferenceDevice;
use crate::layout::len_or_zero;
use crate::matrix::{view, view_mut};
use specula_backend_api::host::{slice, slice_mut};

/// The leftmost start of `pattern` in `haystack`.
fn leftmost(haystack: &[i32], pattern: &[i32]) -> Option<usize> {
    (0..haystack.len().saturating_sub(pattern.len()) + 1)
        .find(|&i| haystack.get(i..i + pattern.len()) == Some(pattern))
}

/// The drafts of one decode slot whose history row is `row`, prompt `P` tokens, `step` generated
/// tokens (`P + step ≤ row.len()`), allowed at most `allowance` drafts.
fn propose(
    row: &[i32],
    prompt_len: usize,
    step: usize,
    allowance: usize,
    params: &NgramParams,
) -> Vec<i32> {
    if allowance == 0 {
        return Vec::new();
    }
    let prompt = &row[..prompt_len];
    let generated = &row[prompt_len..prompt_len + step];
    let longest = params.max_ngram_size.min(step);
    for n in (params.min_ngram_size..=longest).rev() {
        let pattern = &generated[step - n..];
        if let Some(i) = leftmost(prompt, pattern).filter(|&i| i + n < prompt_len) {
            return prompt[i + n..(i + n + allowance).min(prompt_len)].to_vec();
        }
        // In the history, a match must start before `step − n` (not the pattern itself).
        if let Some(q) = leftmost(&generated[..step - 1], pattern) {
            return generated[q + n..(q + n + allowance).min(step)].to_vec();
        }
    }
    Vec::new()
}

/// Proposes drafts for every decode slot and grants them from the budget in slot order; writes
/// `draft_tokens[b, 1 ..]` and `seq_lens_this_time[b] = 1 + drafts` for decode slots only.
pub(crate) fn ngram_match(
    inputs: &NgramInputs<'_>,
    out: &mut NgramOutputs<'_>,
    params: &NgramParams,
) -> Result<()> {
    let op = Op::NgramMatch;
    let dims = params.dims;
    let (s, max_model_len) = (dims.max_step_tokens, params.max_model_len);
    let history = view::<i32>(op, inputs.token_ids_all, dims.max_bsz, max_model_len)?;
    let prompt_lens = slice::<i32>(inputs.prompt_lens)?;
    let step_idx = slice::<i32>(inputs.step_idx)?;
    let draft_token_num = slice::<i32>(inputs.draft_token_num)?;
    let encoder = slice::<i32>(inputs.seq_lens_encoder)?;
    let max_dec_len = slice::<i32>(inputs.max_dec_len)?;
    let this_time = slice_mut::<i32>(out.seq_lens_this_time)?;
    let mut draft_tokens: ArrayViewMut2<'_, i32> = view_mut(op, out.draft_tokens, dims.max_bsz, s)?;

    // Kinds are decided on the incoming lengths, before any is rewritten.
    let kinds: Vec<SlotKind> = (0..dims.real_bsz)
        .map(|b| slot_kind(this_time[b], encoder[b]))
        .collect();
    let proposals: Vec<Vec<i32>> = (0..dims.real_bsz)
        .map(|b| {
            if kinds[b] != SlotKind::Decode {
                return Vec::new();
            }
            let row = history.row(b).to_vec();
            let prompt_len = len_or_zero(prompt_lens[b]).min(max_model_len);
            let step = len_or_zero(step_idx[b]).min(max_model_len - prompt_len);
            let decode_left = (i64::from(max_dec_len[b]) - step as i64 - 1).max(0);
            let allowance = len_or_zero(draft_token_num[b])
                .min(s - 1)
                .min(usize::try_from(decode_left).unwrap_or(usize::MAX));
            propose(&row, prompt_len, step, allowance, params)
        })
        .collect();

    // Every prefill token and one token per decode slot are fed anyway; drafts share the rest.
    let mandatory = (0..dims.real_bsz).fold(0u64, |sum, b| {
        let fed = if encoder[b] > 0 {
            len_or_zero(this_time[b]) as u64
        } else {
            u64::from(kinds[b] == SlotKind::Decode)
        };
        sum.saturating_add(fed)
    });
    let mut left = (params.threshold as u64).saturating_sub(mandatory);
    for b in 0..dims.real_bsz {
        if kinds[b] != SlotKind::Decode {
            continue;
        }
        let granted = proposals[b]
            .len()
            .min(usize::try_from(left).unwrap_or(usize::MAX));
        left -= granted as u64;
        for (k, &token) in proposals[b][..granted].iter().enumerate() {
            draft_tokens[[b, 1 + k]] = token;
        }
        this_time[b] = 1 + granted as i32;
    }
    Ok(())
}

/// Runs a validated `ngram_match` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, _) = call.parts();
    ngram_match(inputs, out, params)
}
