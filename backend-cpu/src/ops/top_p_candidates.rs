//! `top_p_candidates` (`docs/semantics.md` §5.7): the first C tokens in rank order with a nonzero weight, and
//! the length of the shortest prefix of them that reaches `top_p`.

use rayon::prelude::*;
use specula_backend_api::fixed_point::{key_weight, rank_key};
use specula_backend_api::ops::top_p_candidates::OpCall;
use specula_backend_api::ops::{CandidatesInputs, CandidatesOutputs, CandidatesParams};
use specula_backend_api::{DType, FloatElement, Op, Result};

use super::with_float;
use crate::CpuDevice;
use crate::sampling::fast::candidates_row_fast;
use crate::sampling::histogram::{
    Metric, Prefix, first_prob_in_rank, shortest_prefix, totals, with_scratch,
};
use crate::sampling::{CandidateRow, logits};
use specula_backend_api::host::{slice, slice_mut};

/// The histogram path of a probability row's candidates (the fast path,
/// [`crate::sampling::fast::candidates_row_fast`], makes the same decisions): fills `out` and
/// returns `lens`.
pub(crate) fn candidates_row_histogram<T: FloatElement>(
    row: &[T],
    top_p: f32,
    out: &mut CandidateRow<'_>,
) -> i32 {
    let c = out.capacity();
    // The tokens with w > 0 carry the whole weight of the row; the candidates are the first C.
    let (valid, total) = with_scratch(|s| {
        let all = totals(row, &Prefix::POSITIVE_WEIGHT, s);
        let valid = if all.count <= c {
            Prefix {
                count: all.count,
                mass: all.mass,
                ..Prefix::POSITIVE_WEIGHT
            }
        } else {
            shortest_prefix(row, &Prefix::POSITIVE_WEIGHT, Metric::Count, c as u64, s)
        };
        (valid, all.mass)
    });
    if valid.count == 0 {
        return out.only(first_prob_in_rank(row));
    }
    let mut chosen: Vec<(u32, u32)> = Vec::with_capacity(valid.count);
    let mut member = valid.member();
    for (id, &v) in row.iter().enumerate() {
        let key = rank_key(v.to_f32());
        if member.admit(key) {
            chosen.push((key, id as u32));
        }
    }
    // At most C entries: ordering them is cheap. Stable, so equal keys stay in id order.
    chosen.sort_by_key(|&(key, _)| std::cmp::Reverse(key));
    let members = chosen
        .iter()
        .map(|&(key, id)| (id, f32::from_bits(key), key_weight(key)));
    out.fill(members, top_p, total)
}

/// The candidates of every row; `temperature` is given for logits rows (`docs/semantics.md` §4b).
pub(crate) fn top_p_candidates(
    dtype: DType,
    inputs: &CandidatesInputs<'_>,
    temperature: Option<&[f32]>,
    out: &mut CandidatesOutputs<'_>,
    params: &CandidatesParams<'_>,
) -> Result<()> {
    let vocab = params.shape.vocab;
    let c = params.candidates;
    let top_p = slice::<f32>(inputs.top_p)?;
    let batch_id = match inputs.batch_id_per_token_output {
        Some(b) => Some(slice::<i32>(b)?),
        None => None,
    };
    let ids = slice_mut::<i32>(out.ids)?;
    let scores = slice_mut::<f32>(out.scores)?;
    let lens = slice_mut::<i32>(out.lens)?;
    with_float!(dtype, Op::TopPCandidates, T => {
        let probs = slice::<T>(inputs.scores.matrix())?;
        let parts = super::parts_per_row(probs.len() / vocab);
        ids.par_chunks_exact_mut(c)
            .zip(scores.par_chunks_exact_mut(c))
            .zip(lens.par_iter_mut())
            .zip(probs.par_chunks_exact(vocab))
            .enumerate()
            .for_each(|(r, (((ids, scores), len), row))| {
                let mut out = CandidateRow { ids, scores };
                let p = top_p[r];
                if batch_id.is_some_and(|b| b[r] < 0) {
                    out.clear();
                    *len = 0;
                } else if let Some(t) = temperature {
                    *len = logits::candidates_row(row, t[r], p, &mut out);
                } else {
                    // The single-pass fast path when it applies, the histogram path otherwise.
                    *len = candidates_row_fast(row, p, &mut out, parts)
                        .unwrap_or_else(|| candidates_row_histogram(row, p, &mut out));
                }
            });
        Ok(())
    })
}

/// Runs a validated `top_p_candidates` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let temperature = super::logits_temperature(&inputs.scores, kind)?;
    device.install(|| top_p_candidates(kind.dtype, inputs, temperature, out, params))?;
    let Some(fallback) = inputs.fallback else {
        return Ok(());
    };
    let fallback = slice::<i32>(fallback)?;
    let (rows, vocab, c) = (params.shape.rows, params.shape.vocab, params.candidates);
    let ids = slice_mut::<i32>(out.ids)?;
    let lens = slice_mut::<i32>(out.lens)?;
    for r in 0..rows {
        // A row of total weight 0 lists its first token in rank order, weighing nothing.
        if lens[r] == 0 {
            continue;
        }
        let value = super::row_value(inputs.scores.matrix(), kind.dtype, r, vocab, ids[r * c])?;
        if super::weighs_nothing(value, kind.logits) {
            ids[r * c] = fallback[r];
            lens[r] = i32::from(fallback[r] >= 0);
        }
    }
    Ok(())
}
