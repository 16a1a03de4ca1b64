//! `top_k_top_p_sample` (`docs/semantics.md` §5.6), written with a sort: the
//! survivors and the kept set are prefixes of the row's rank order. The kept set is shared with
//! the REJECTION strategy of `verify_draft_tokens`, whose target row is filtered the same way.

use specula_backend_api::ops::top_k_top_p_sample::OpCall;
use specula_backend_api::ops::{RowShape, SampleInputs, ScoresKind};
use specula_backend_api::rng::Purpose;
use specula_backend_api::{Buffer, Op, Result};

use crate::ReferenceDevice;
use crate::matrix::ScoreMatrix;
use crate::weights::{WeightedRow, draw_by_weight, reaches_top_p, top_p_fixed};
use specula_backend_api::host::{slice, slice_mut};

/// What top-k and top-p leave of a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// The survivors weigh nothing: the answer is this token, the first in rank order.
    Degenerate(usize),
    /// The kept token ids, in rank order (never empty; their total weight is positive).
    Prefix(Vec<usize>),
}

/// Top-k, then top-p (`docs/semantics.md` §5.6 steps 1 and 2).
pub(crate) fn kept_set(row: &WeightedRow, top_k: i32, top_p: f32) -> Kept {
    let order = row.rank_order();
    let survivors = match usize::try_from(top_k) {
        Ok(k) if k > 0 && k < row.len() => &order[..k],
        _ => &order[..],
    };
    let total: u64 = survivors.iter().map(|&id| row.weight(id)).sum();
    if total == 0 {
        return Kept::Degenerate(order[0]);
    }
    let p = top_p_fixed(top_p);
    let mut mass = 0u64;
    for (n, &id) in survivors.iter().enumerate() {
        mass += row.weight(id);
        if reaches_top_p(mass, p, total) {
            return Kept::Prefix(survivors[..=n].to_vec());
        }
    }
    // The whole survivor set reaches any top_p ≤ 1; kept for totality.
    Kept::Prefix(survivors.to_vec())
}

/// Samples one row: the kept set, then the SAMPLE draw of `seed` over it in ascending id order. A
/// row of weight 0 yields `fallback` when given, else its first token in rank order.
pub(crate) fn sample_row(
    row: &WeightedRow,
    top_k: i32,
    top_p: f32,
    seed: u64,
    fallback: Option<i32>,
) -> i32 {
    match kept_set(row, top_k, top_p) {
        Kept::Degenerate(first) => fallback.unwrap_or(first as i32),
        Kept::Prefix(mut kept) => {
            kept.sort_unstable();
            let members = kept.iter().map(|&id| (id as i32, row.weight(id)));
            // The kept mass is positive, so the draw always lands on a member.
            draw_by_weight(members, seed, Purpose::Sample).unwrap_or(kept[0] as i32)
        }
    }
}

/// Samples every row with its `top_k`, `top_p` and seed.
pub(crate) fn top_k_top_p_sample(
    kind: ScoresKind,
    inputs: &SampleInputs<'_>,
    tokens: &mut Buffer,
    shape: &RowShape,
) -> Result<()> {
    let rows = ScoreMatrix::new(
        Op::TopKTopPSample,
        kind,
        &inputs.scores,
        shape.rows,
        shape.vocab,
    )?;
    let top_k = slice::<i32>(inputs.top_k)?;
    let top_p = slice::<f32>(inputs.top_p)?;
    let seed = slice::<u64>(inputs.seed)?;
    let fallback = inputs.fallback.map(slice::<i32>).transpose()?;
    for (r, token) in slice_mut::<i32>(tokens)?.iter_mut().enumerate() {
        if let Some(row) = rows.row(r) {
            let fallback = fallback.map(|f| f[r]);
            *token = sample_row(&row, top_k[r], top_p[r], seed[r], fallback);
        }
    }
    Ok(())
}

/// Runs a validated `top_k_top_p_sample` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, tokens, params, kind) = call.parts();
    top_k_top_p_sample(*kind, inputs, tokens, &params.shape)
}
