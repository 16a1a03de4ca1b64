//! `top_p_candidates` (`docs/semantics.md` §5.7), written with a sort.

use ndarray::ArrayViewMut1;
use specula_backend_api::ops::top_p_candidates::OpCall;
use specula_backend_api::ops::{CandidatesInputs, CandidatesOutputs, CandidatesParams, ScoresKind};
use specula_backend_api::{Op, Result};

use crate::ReferenceDevice;
use crate::matrix::{ScoreMatrix, view_mut};
use crate::weights::{WeightedRow, reaches_top_p, top_p_fixed};
use specula_backend_api::host::{slice, slice_mut};

/// Fills one row's `ids` and `scores` (C each, already -1 / 0) and returns its `lens`: the first C
/// tokens in rank order with a positive weight and their scores (sanitized probabilities, or a
/// logits row's exact shares); `lens` is the
/// shortest prefix of them reaching `top_p` of the whole row's weight, or all of them when even
/// they fall short. A row of weight 0 yields `fallback` when given (nothing, lens 0, when it is
/// negative), else its first token in rank order; with score 0, lens 1.
fn candidates_row(
    row: &WeightedRow,
    top_p: f32,
    fallback: Option<i32>,
    mut ids: ArrayViewMut1<'_, i32>,
    mut scores: ArrayViewMut1<'_, f32>,
) -> i32 {
    let order = row.rank_order();
    let total = row.total();
    if total == 0 {
        ids[0] = fallback.unwrap_or(order[0] as i32);
        return i32::from(ids[0] >= 0);
    }
    let valid = order.iter().filter(|&&id| row.weight(id) > 0);
    let p = top_p_fixed(top_p);
    let mut mass = 0u64;
    let mut lens = None;
    let mut count = 0;
    for (k, &id) in valid.take(ids.len()).enumerate() {
        ids[k] = id as i32;
        scores[k] = row.score(id);
        mass += row.weight(id);
        count = k + 1;
        if lens.is_none() && reaches_top_p(mass, p, total) {
            lens = Some(count);
        }
    }
    lens.unwrap_or(count) as i32
}

/// The candidates of every row; a row whose `batch_id_per_token_output` entry (when given) is
/// negative is padding: ids -1, scores 0, lens 0.
pub(crate) fn top_p_candidates(
    kind: ScoresKind,
    inputs: &CandidatesInputs<'_>,
    out: &mut CandidatesOutputs<'_>,
    params: &CandidatesParams<'_>,
) -> Result<()> {
    let (rows, vocab, c) = (params.shape.rows, params.shape.vocab, params.candidates);
    let op = Op::TopPCandidates;
    let matrix = ScoreMatrix::new(op, kind, &inputs.scores, rows, vocab)?;
    let top_p = slice::<f32>(inputs.top_p)?;
    let batch_id = inputs
        .batch_id_per_token_output
        .map(slice::<i32>)
        .transpose()?;
    let fallback = inputs.fallback.map(slice::<i32>).transpose()?;
    let mut ids = view_mut::<i32>(op, out.ids, rows, c)?;
    let mut scores = view_mut::<f32>(op, out.scores, rows, c)?;
    let lens = slice_mut::<i32>(out.lens)?;
    ids.fill(-1);
    scores.fill(0.0);
    lens.fill(0);
    for r in 0..rows {
        let padding = batch_id.is_some_and(|b| b[r] < 0);
        let Some(row) = matrix.row(r).filter(|_| !padding) else {
            continue;
        };
        let fallback = fallback.map(|f| f[r]);
        lens[r] = candidates_row(&row, top_p[r], fallback, ids.row_mut(r), scores.row_mut(r));
    }
    Ok(())
}

/// Runs a validated `top_p_candidates` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    top_p_candidates(*kind, inputs, out, params)
}
