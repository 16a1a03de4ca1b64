//! `accept_logprobs` (`docs/semantics.md` §5.11): log-probabilities, ranks and top-K of the accepted tokens.
//!
//! The accepted counts are packed first (a short sequential prefix sum); then every packed entry is
//! independent and runs in parallel. Per entry the source row is read twice: one pass for the
//! maximum, the token's rank and the top-K (a bounded insertion into at most K ≤ 64 slots, never a
//! sort of the row), one for the normaliser. Log-probabilities follow the softmax rules exactly
//! (same temperature handling and special rows), so `exp(logprob)` is what `softmax` returns.

use rayon::prelude::*;
use specula_backend_api::ops::accept_logprobs::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::{DType, FloatElement, Op, Result};

use super::argmax::ranks_above;
use super::softmax::{RowStats, effective_temperature, row_stats, scaled};
use super::{len_or_zero, token_index, with_float};
use crate::CpuDevice;
use specula_backend_api::host::{slice, slice_mut};

/// Where a packed entry comes from.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The accepted token id (raw device content).
    token: i32,
    /// The logits row it is scored against, if that row exists.
    row: Option<usize>,
}

/// The log-probability of logit `x` (entry `i` of the row, temperature `t`) under `stats`.
#[inline]
fn logprob(stats: &RowStats, i: usize, x: f32, t: f32, vocab: usize) -> f32 {
    match *stats {
        RowStats::OneHot(arg) => {
            if i == arg {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        }
        RowStats::PosInf { count } => {
            if x == f32::INFINITY {
                -(count as f32).ln()
            } else {
                f32::NEG_INFINITY
            }
        }
        RowStats::AllNegInf => -(vocab as f32).ln(),
        RowStats::Finite { max, sum } => scaled(x, max, t) - sum.ln(),
    }
}

/// Logit order for the rank: NaN counts as −inf.
#[inline(always)]
fn rank_value(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// Inserts `(value, id)` into `top` (sorted best first, at most `k` long) if it belongs there.
///
/// Ids arrive in ascending order, so an equal value never displaces an earlier one: ties go to
/// the lower id, as the contract asks.
#[inline]
fn offer(top: &mut Vec<(f32, usize)>, k: usize, value: f32, id: usize) {
    if top.len() == k {
        match top.last() {
            Some(&(last, _)) if ranks_above(value, last) => {
                top.pop();
            }
            _ => return,
        }
    }
    let at = top.partition_point(|&(v, _)| !ranks_above(value, v));
    top.insert(at, (value, id));
}

/// Scores one packed entry: writes its log-probability and rank, and fills its top-K slots.
fn score_entry<T: FloatElement>(
    row: &[T],
    temperature: f32,
    token: i32,
    logprob_out: &mut f32,
    rank_out: &mut i32,
    top_ids: &mut [i32],
    top_logprobs: &mut [f32],
) {
    let vocab = row.len();
    let t = effective_temperature(temperature);
    let stats = row_stats(row, t);
    let lp = |i: usize| -> f32 {
        let x = row.get(i).map_or(f32::NEG_INFINITY, |v| v.to_f32());
        logprob(&stats, i, x, t, vocab)
    };

    let k = top_ids.len();
    let token = token_index(token, vocab);
    let token_value = token
        .and_then(|i| row.get(i))
        .map(|v| rank_value(v.to_f32()));
    let mut larger = 0usize;
    let mut top = Vec::with_capacity(k);
    // One pass for the rank and the top-K; each part is skipped when not asked for.
    if token_value.is_some() || k > 0 {
        for (i, v) in row.iter().enumerate() {
            let x = v.to_f32();
            if let Some(tv) = token_value {
                larger += usize::from(rank_value(x) > tv);
            }
            if k > 0 {
                offer(&mut top, k, x, i);
            }
        }
    }

    match token {
        Some(i) => {
            *logprob_out = lp(i);
            *rank_out = i32::try_from(larger + 1).unwrap_or(i32::MAX);
        }
        None => {
            *logprob_out = f32::NEG_INFINITY;
            *rank_out = 0;
        }
    }
    for (slot, (id, lp_out)) in top_ids.iter_mut().zip(top_logprobs.iter_mut()).enumerate() {
        match top.get(slot) {
            Some(&(_, i)) => {
                *id = i as i32;
                *lp_out = lp(i);
            }
            // Only when K > V: the row has fewer ids than slots.
            None => {
                *id = -1;
                *lp_out = f32::NEG_INFINITY;
            }
        }
    }
}

/// Packs the accepted tokens and scores each against its logits row.
pub(crate) fn accept_logprobs(
    dtype: DType,
    inputs: &LogprobsInputs<'_>,
    out: &mut LogprobsOutputs<'_>,
    params: &LogprobsParams<'_>,
) -> Result<()> {
    let dims = &params.dims;
    let s = dims.max_step_tokens;
    let vocab = params.shape.vocab;
    let rows = params.shape.rows;
    let k = params.top_k;
    let accept_tokens = slice::<i32>(inputs.accept_tokens)?;
    let accept_num = slice::<i32>(inputs.accept_num)?;
    let encoder = slice::<i32>(inputs.seq_lens_encoder)?;
    let cu_out = slice::<i32>(inputs.cu_seqlens_q_output)?;
    let temperature = slice::<f32>(inputs.temperature)?;

    // Sequential: max_bsz + 1 prefix sums and one small descriptor per accepted token.
    let cu_accept = slice_mut::<i32>(out.cu_accept)?;
    let mut entries = Vec::with_capacity(dims.max_bsz * s);
    cu_accept[0] = 0;
    for b in 0..dims.max_bsz {
        let n = if b < dims.real_bsz {
            len_or_zero(accept_num[b]).min(s)
        } else {
            0
        };
        let base = cu_out.get(b).map(|&c| i64::from(c));
        let prefill = encoder[b] > 0;
        for pos in 0..n {
            let row = base
                .map(|base| if prefill { base } else { base + pos as i64 })
                .and_then(|r| usize::try_from(r).ok())
                .filter(|&r| r < rows);
            entries.push(Entry {
                token: accept_tokens[b * s + pos],
                row,
            });
        }
        // ≤ max_bsz · S entries, which the validated buffers hold, so this fits in i32 in practice;
        // saturate rather than wrap if it ever did not.
        cu_accept[b + 1] = i32::try_from(entries.len()).unwrap_or(i32::MAX);
    }

    let token_ids = slice_mut::<i32>(out.token_ids)?;
    let logprobs = slice_mut::<f32>(out.logprobs)?;
    let ranks = slice_mut::<i32>(out.ranks)?;
    let top_ids = slice_mut::<i32>(out.top_ids)?;
    let top_logprobs = slice_mut::<f32>(out.top_logprobs)?;
    // Per-entry top-K windows; with K = 0 every entry gets an empty window (chunks of 0 would
    // panic, and skipping the zip would skip the entries).
    let mut id_windows: Vec<&mut [i32]> = Vec::with_capacity(token_ids.len());
    let mut lp_windows: Vec<&mut [f32]> = Vec::with_capacity(token_ids.len());
    if k == 0 {
        id_windows.resize_with(token_ids.len(), Default::default);
        lp_windows.resize_with(token_ids.len(), Default::default);
    } else {
        id_windows.extend(top_ids.chunks_mut(k));
        lp_windows.extend(top_logprobs.chunks_mut(k));
    }

    with_float!(dtype, Op::AcceptLogprobs, T => {
        let logits = slice::<T>(inputs.logits)?;
        token_ids
            .par_iter_mut()
            .zip(logprobs.par_iter_mut())
            .zip(ranks.par_iter_mut())
            .zip(id_windows.par_iter_mut())
            .zip(lp_windows.par_iter_mut())
            .enumerate()
            .for_each(|(p, ((((token_out, lp_out), rank_out), ids), lps))| {
                let entry = entries.get(p);
                *token_out = entry.map_or(-1, |e| e.token);
                let row = entry
                    .and_then(|e| e.row)
                    .and_then(|r| Some((logits.get(r * vocab..(r + 1) * vocab)?, *temperature.get(r)?)));
                match (entry, row) {
                    (Some(e), Some((row, t))) => score_entry(row, t, e.token, lp_out, rank_out, ids, lps),
                    // Padding entries and entries whose source row does not exist.
                    _ => {
                        *lp_out = f32::NEG_INFINITY;
                        *rank_out = 0;
                        ids.fill(-1);
                        lps.fill(f32::NEG_INFINITY);
                    }
                }
            });
        Ok(())
    })
}

/// Runs a validated `accept_logprobs` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, dtype) = call.parts();
    device.install(|| accept_logprobs(*dtype, inputs, out, params))
}
