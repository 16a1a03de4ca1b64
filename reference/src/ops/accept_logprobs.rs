//! `accept_logprobs` (`docs/semantics.md` §5.11): log-probabilities, ranks and
//! top-K of the accepted tokens, packed.

use ndarray::{ArrayViewMut1, ArrayViewMut2};
use specula_backend_api::ops::accept_logprobs::OpCall;
use specula_backend_api::ops::{LogprobsInputs, LogprobsOutputs, LogprobsParams};
use specula_backend_api::{DType, Op, Result};

use super::softmax::{Distribution, effective_temperature};
use crate::ReferenceDevice;
use crate::layout::{len_or_zero, saturate_i32, token_index};
use crate::matrix::{FloatMatrix, view, view_mut};
use crate::weights::logit_order;
use specula_backend_api::host::{slice, slice_mut};

const OP: Op = Op::AcceptLogprobs;

/// One packed entry: an accepted token and the logits row it is scored against.
#[derive(Clone, Copy, Debug)]
struct Entry {
    token: i32,
    /// The source row (`base` for a prefill, `base + k` for decode token `k`), if it exists.
    row: Option<usize>,
}

/// The outputs of one entry.
struct EntryOut<'a> {
    logprob: &'a mut f32,
    rank: &'a mut i32,
    top_ids: ArrayViewMut1<'a, i32>,
    top_logprobs: ArrayViewMut1<'a, f32>,
}

/// The packed entries, slot by slot, and `cu_accept` (their exclusive prefix sum per slot).
fn entries(
    inputs: &LogprobsInputs<'_>,
    params: &LogprobsParams<'_>,
    cu_accept: &mut [i32],
) -> Result<Vec<Entry>> {
    let dims = params.dims;
    let s = dims.max_step_tokens;
    let accept_tokens = view::<i32>(OP, inputs.accept_tokens, dims.max_bsz, s)?;
    let accept_num = slice::<i32>(inputs.accept_num)?;
    let encoder = slice::<i32>(inputs.seq_lens_encoder)?;
    let cu_out = slice::<i32>(inputs.cu_seqlens_q_output)?;
    let mut out = Vec::new();
    cu_accept[0] = 0;
    for b in 0..dims.max_bsz {
        let n = if b < dims.real_bsz {
            len_or_zero(accept_num[b]).min(s)
        } else {
            0
        };
        for k in 0..n {
            let base = cu_out.get(b).map(|&c| i64::from(c));
            let row = base.map(|base| {
                if encoder[b] > 0 {
                    base
                } else {
                    base + k as i64
                }
            });
            let row = row
                .and_then(|r| usize::try_from(r).ok())
                .filter(|&r| r < params.shape.rows);
            out.push(Entry {
                token: accept_tokens[[b, k]],
                row,
            });
        }
        cu_accept[b + 1] = saturate_i32(out.len() as i64);
    }
    Ok(out)
}

/// 1 + the number of logits strictly larger than the token's (NaN counts as −inf).
fn rank(row: &[f32], id: usize) -> i32 {
    let clean = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    let value = clean(row[id]);
    let larger = row.iter().filter(|&&x| clean(x) > value).count();
    saturate_i32(larger as i64 + 1)
}

/// The `k` best ids of a row in logit order (descending, NaN last, ties to the lower id).
fn top_ids(row: &[f32], k: usize) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    let order = |a: &usize, b: &usize| logit_order(row[*a], row[*b]).then(a.cmp(b));
    if k < ids.len() {
        // Only the first k are needed: partition them out, then sort them.
        ids.select_nth_unstable_by(k, order);
        ids.truncate(k);
    }
    ids.sort_unstable_by(order);
    ids
}

/// Scores one entry against its logits row at temperature `t`.
fn score(row: &[f32], t: f32, token: i32, out: EntryOut<'_>) {
    let distribution = Distribution::of(row, effective_temperature(t));
    let logprob = |id: usize| distribution.logprob(id, row[id]);
    match token_index(token, row.len()) {
        Some(id) => {
            *out.logprob = logprob(id);
            *out.rank = rank(row, id);
        }
        None => {
            *out.logprob = f32::NEG_INFINITY;
            *out.rank = 0;
        }
    }
    let k = out.top_ids.len();
    let best = if k > 0 { top_ids(row, k) } else { Vec::new() };
    let (mut ids, mut lps) = (out.top_ids, out.top_logprobs);
    for (slot, &id) in best.iter().enumerate() {
        ids[slot] = id as i32;
        lps[slot] = logprob(id);
    }
}

/// Packs the accepted tokens and scores each against its logits row.
pub(crate) fn accept_logprobs(
    dtype: DType,
    inputs: &LogprobsInputs<'_>,
    out: &mut LogprobsOutputs<'_>,
    params: &LogprobsParams<'_>,
) -> Result<()> {
    let (rows, vocab, k) = (params.shape.rows, params.shape.vocab, params.top_k);
    let packed = params.dims.max_bsz * params.dims.max_step_tokens;
    let logits = FloatMatrix::new(OP, dtype, inputs.logits, rows, vocab)?;
    let temperature = slice::<f32>(inputs.temperature)?;
    let entries = entries(inputs, params, slice_mut(out.cu_accept)?)?;

    // Defaults: what padding entries and entries without a source row keep.
    let token_ids = slice_mut::<i32>(out.token_ids)?;
    let logprobs = slice_mut::<f32>(out.logprobs)?;
    let ranks = slice_mut::<i32>(out.ranks)?;
    let mut top_ids: ArrayViewMut2<'_, i32> = view_mut(OP, out.top_ids, packed, k)?;
    let mut top_logprobs: ArrayViewMut2<'_, f32> = view_mut(OP, out.top_logprobs, packed, k)?;
    token_ids.fill(-1);
    logprobs.fill(f32::NEG_INFINITY);
    ranks.fill(0);
    top_ids.fill(-1);
    top_logprobs.fill(f32::NEG_INFINITY);

    for (p, entry) in entries.iter().enumerate().take(packed) {
        token_ids[p] = entry.token;
        let Some(r) = entry.row else { continue };
        let (Some(row), Some(&t)) = (logits.row(r), temperature.get(r)) else {
            continue;
        };
        let out = EntryOut {
            logprob: &mut logprobs[p],
            rank: &mut ranks[p],
            top_ids: top_ids.row_mut(p),
            top_logprobs: top_logprobs.row_mut(p),
        };
        score(&row, t, entry.token, out);
    }
    Ok(())
}

/// Runs a validated `accept_logprobs` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, dtype) = call.parts();
    accept_logprobs(*dtype, inputs, out, params)
}
