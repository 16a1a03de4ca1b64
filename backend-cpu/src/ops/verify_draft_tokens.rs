//! `verify_draft_tokens` (`docs/semantics.md` §5.8): one independent task per slot.

use rayon::prelude::*;
use specula_backend_api::abi::REJECTION_MAX_TOTAL_WEIGHT;
use specula_backend_api::fixed_point::{key_weight, rank_key, scale_draw, top_p_fixed, weight};
use specula_backend_api::ops::verify_draft_tokens::OpCall;
use specula_backend_api::ops::{StrategyInputs, VerifyInputs, VerifyOutputs, VerifyParams};
use specula_backend_api::rng::{Purpose, draw};
use specula_backend_api::{DType, FloatElement, Op, Result};

use super::top_k_top_p_sample::sample_prob_row;
use super::{len_or_zero, token_index, with_float};
use crate::CpuDevice;
use crate::sampling::histogram::{
    Kept, Prefix, first_prob_in_rank, prob_kept_set, total_weight, weight_in_prefix,
};
use crate::sampling::logits::{self, KeptLogits, Weighing};
use specula_backend_api::host::{VerifySlices, slice, slice_mut};

/// The strategy inputs as host slices.
enum Strategy<'a, T, D> {
    Greedy(&'a [i32]),
    TargetMatch(&'a [i32]),
    TopP {
        ids: &'a [i32],
        scores: &'a [f32],
        lens: &'a [i32],
        candidates: usize,
    },
    Rejection {
        target: &'a [T],
        draft: &'a [D],
        top_k: &'a [i32],
        top_p: &'a [f32],
        /// The rows' temperatures when target and draft rows are logits (`docs/semantics.md` §4b).
        temperature: Option<&'a [f32]>,
        /// The target rows' fallbacks (`process_logits`), when given.
        fallback: Option<&'a [i32]>,
        /// The row of `draft` of each draft (`docs/semantics.md` §5.8.1); `None`: dense.
        draft_index: Option<&'a [i32]>,
    },
}

/// Everything a slot reads.
struct Context<'a, T, D> {
    max_step_tokens: usize,
    real_bsz: usize,
    rows: usize,
    vocab: usize,
    accept_all: bool,
    reject_all: bool,
    /// The drafts, the layout and the slot state (the unpacking shared with the reference).
    slots: VerifySlices<'a>,
    strategy: Strategy<'a, T, D>,
}

/// The tokens a slot emits, with the stop rules of the contract.
struct Emitter<'a> {
    tokens: &'a mut [i32],
    len: usize,
    count: i64,
    max_dec_len: i64,
    end_tokens: &'a [i32],
    stopped: bool,
}

impl Emitter<'_> {
    /// Emits `token`; an end token is kept and stops the slot, the token that reaches
    /// `max_dec_len` is replaced by `end_tokens[0]` and stops the slot.
    fn emit(&mut self, token: i32) {
        self.count += 1;
        let token = if self.end_tokens.contains(&token) {
            self.stopped = true;
            token
        } else if self.count >= self.max_dec_len {
            self.stopped = true;
            self.end_tokens[0]
        } else {
            token
        };
        self.tokens[self.len] = token;
        self.len += 1;
    }
}

impl<T: FloatElement, D: FloatElement> Context<'_, T, D> {
    /// Output row `row` as an index, if it exists.
    fn row(&self, row: i64) -> Option<usize> {
        usize::try_from(row).ok().filter(|&r| r < self.rows)
    }

    fn target_row<'t>(&self, target: &'t [T], row: usize) -> &'t [T] {
        &target[row * self.vocab..(row + 1) * self.vocab]
    }

    /// The GREEDY / TARGET_MATCH target token of a row, -1 when the row does not exist.
    fn target_token(tokens: &[i32], row: Option<usize>) -> i32 {
        row.map_or(-1, |r| tokens[r])
    }

    /// Whether draft `d` (checked against output row `row`) is accepted, and for REJECTION the
    /// correction token when it is not. An id outside the vocabulary is never accepted; under
    /// REJECTION it weighs 0 in both rows and is rejected like any other draft (the correction
    /// comes from the residual).
    fn check(&self, slot: usize, i: usize, d: i32, row: Option<usize>) -> (bool, Option<i32>) {
        let d_index = token_index(d, self.vocab);
        if self.accept_all && d_index.is_some() {
            return (true, None);
        }
        match &self.strategy {
            Strategy::Greedy(tokens) | Strategy::TargetMatch(tokens) => (
                d_index.is_some() && d == Self::target_token(tokens, row),
                None,
            ),
            Strategy::TopP {
                ids,
                lens,
                candidates,
                ..
            } => {
                let Some(r) = row.filter(|_| d_index.is_some()) else {
                    return (false, None);
                };
                let n = len_or_zero(lens[r]).min(*candidates);
                (ids[r * candidates..r * candidates + n].contains(&d), None)
            }
            Strategy::Rejection {
                target,
                draft,
                top_k,
                top_p,
                temperature,
                draft_index,
                ..
            } => {
                let Some(r) = row else { return (false, None) };
                // A draft row outside the draft rows rejects the draft; phase 2 then samples
                // the target row, as for a row that is not a distribution (§5.8.1).
                let Some(q) = draft_row(
                    draft,
                    *draft_index,
                    slot * (self.max_step_tokens - 1) + i,
                    self.vocab,
                ) else {
                    return (false, None);
                };
                let p = self.target_row(target, r);
                let (accepted, correction) = match temperature {
                    Some(t) => rejection_check_logits(
                        p,
                        q,
                        t[r],
                        d_index,
                        top_k[r],
                        top_p[r],
                        self.slots.seeds[r],
                    ),
                    None => rejection_check(p, q, d_index, top_k[r], top_p[r], self.slots.seeds[r]),
                };
                let correction = self.or_fallback(p, correction, r);
                (accepted, Some(correction).filter(|_| !accepted))
            }
        }
    }

    /// A token sampled from target row `p` (row `r`), or the row's fallback when it is given and
    /// the token weighs nothing — exactly when the row's kept weight is 0 (a residual draw always
    /// lands on a token of positive weight).
    fn or_fallback(&self, p: &[T], token: i32, r: usize) -> i32 {
        let Strategy::Rejection {
            fallback: Some(fallback),
            temperature,
            ..
        } = &self.strategy
        else {
            return token;
        };
        let value =
            super::token_index(token, self.vocab).map_or(f32::NEG_INFINITY, |v| p[v].to_f32());
        match super::weighs_nothing(value, temperature.is_some()) {
            true => fallback[r],
            false => token,
        }
    }

    /// The phase-2 token from output row `row` (-1 when the row does not exist).
    fn phase2(&self, row: Option<usize>) -> i32 {
        match &self.strategy {
            Strategy::Greedy(tokens) | Strategy::TargetMatch(tokens) => {
                Self::target_token(tokens, row)
            }
            Strategy::TopP {
                ids,
                scores,
                lens,
                candidates,
            } => {
                let Some(r) = row else { return -1 };
                let c = *candidates;
                let n = len_or_zero(lens[r]).min(c);
                let ids = &ids[r * c..(r + 1) * c];
                let weights: Vec<u64> = scores[r * c..r * c + n]
                    .iter()
                    .map(|&s| weight(s))
                    .collect();
                let total: u64 = weights.iter().sum();
                if total == 0 {
                    return ids[0];
                }
                let t = scale_draw(draw(self.slots.seeds[r], Purpose::Candidate), total);
                let mut cumulative = 0;
                for (k, w) in weights.iter().enumerate() {
                    cumulative += w;
                    if cumulative > t {
                        return ids[k];
                    }
                }
                ids[0]
            }
            Strategy::Rejection {
                target,
                top_k,
                top_p,
                temperature: Some(t),
                ..
            } => {
                let Some(r) = row else { return -1 };
                let draw = draw(self.slots.seeds[r], Purpose::Sample);
                let p = self.target_row(target, r);
                let token = logits::sample_logit_row(p, t[r], top_k[r], top_p[r], draw) as i32;
                self.or_fallback(p, token, r)
            }
            Strategy::Rejection {
                target,
                top_k,
                top_p,
                temperature: None,
                ..
            } => {
                let Some(r) = row else { return -1 };
                let p = self.target_row(target, r);
                let token = sample_prob_row(p, top_k[r], top_p[r], self.slots.seeds[r], 1) as i32;
                self.or_fallback(p, token, r)
            }
        }
    }

    fn verify_slot(&self, b: usize, tokens: &mut [i32]) -> i32 {
        tokens.fill(-1);
        if b >= self.real_bsz || self.slots.stop_flags[b] != 0 || self.slots.is_block_step[b] != 0 {
            return 0;
        }
        let this_time = len_or_zero(self.slots.seq_lens_this_time[b]).min(self.max_step_tokens);
        if this_time == 0 {
            return 0;
        }
        let s = self.max_step_tokens;
        let base = i64::from(self.slots.cu_seqlens_q_output[b]);
        let mut out = Emitter {
            tokens,
            len: 0,
            count: i64::from(self.slots.step_idx[b].max(0)),
            max_dec_len: i64::from(self.slots.max_dec_len[b]),
            end_tokens: self.slots.end_tokens,
            stopped: false,
        };
        let skip_phase1 = self.slots.seq_lens_encoder[b] > 0
            || self.slots.reasoning_status[b] == 1
            || self.reject_all;
        let mut i = 0;
        let mut correction = None;
        if !skip_phase1 {
            while i + 1 < this_time {
                let d = self.slots.draft_tokens[b * s + i + 1];
                let (accepted, rejected_with) = self.check(b, i, d, self.row(base + i as i64));
                if !accepted {
                    correction = rejected_with;
                    break;
                }
                out.emit(d);
                if out.stopped {
                    return out.len as i32;
                }
                i += 1;
            }
        }
        let token = correction.unwrap_or_else(|| self.phase2(self.row(base + i as i64)));
        // A token outside the vocabulary (a missing row, or candidates a caller made) ends the slot.
        let token = if token_index(token, self.vocab).is_some() {
            token
        } else {
            self.slots.end_tokens[0]
        };
        out.emit(token);
        out.len as i32
    }
}

/// The draft row of dense position `dense` (`b · (S − 1) + i`): that row of `draft`, or with an
/// index the row its entry names; `None` when that row does not exist.
fn draft_row<'a, D>(
    draft: &'a [D],
    index: Option<&[i32]>,
    dense: usize,
    vocab: usize,
) -> Option<&'a [D]> {
    let row = match index {
        None => dense,
        Some(index) => usize::try_from(index[dense]).ok()?,
    };
    draft.get(row * vocab..(row + 1) * vocab)
}

/// The REJECTION test of draft `d` against target row `p` (filtered by `top_k`/`top_p`) and draft
/// row `q`, with the draws of `seed`; `d` is `None` outside the vocabulary (weight 0 in both rows).
/// Returns whether `d` is accepted and otherwise the correction.
fn rejection_check<T: FloatElement, D: FloatElement>(
    p: &[T],
    q: &[D],
    d: Option<usize>,
    top_k: i32,
    top_p: f32,
    seed: u64,
) -> (bool, i32) {
    let resample_target = || sample_prob_row(p, top_k, top_p, seed, 1) as i32;
    let draft_total = total_weight(q);
    if total_weight(p) >= REJECTION_MAX_TOTAL_WEIGHT || draft_total >= REJECTION_MAX_TOTAL_WEIGHT {
        // Not distributions: reject and fall back to plain sampling of the target.
        return (false, resample_target());
    }
    let kept = match prob_kept_set(p, top_k, top_p_fixed(top_p)) {
        Kept::Prefix(prefix) => prefix,
        // The target weighs nothing: no draft can be accepted, and the residual is empty.
        Kept::Degenerate(_) => return (false, resample_target()),
    };
    let wp_d = d.map_or(0, |d| u128::from(weight_in_prefix(p, &kept, d)));
    let wq_d = d.map_or(0, |d| u128::from(key_weight(rank_key(q[d].to_f32()))));
    let (wp_total, wq_total) = (u128::from(kept.mass), u128::from(draft_total));
    let u = u128::from(draw(seed, Purpose::Accept) >> 32);
    let accepted = if wq_d == 0 {
        wp_d > 0
    } else {
        u * wq_d * wp_total < (wp_d * wq_total) << 32
    };
    if let (true, Some(d)) = (accepted, d) {
        return (true, d as i32);
    }
    (
        false,
        residual_sample(p, q, &kept, wp_total, wq_total, seed).unwrap_or_else(resample_target),
    )
}

/// The REJECTION test on logits rows (`docs/semantics.md` §4b, §5.8): the target `p` weighed at `t` and
/// filtered by `top_k`/`top_p`, the draft `q` weighed at the same `t`. The acceptance test is
/// exact (its products reach `2^133`: 192-bit arithmetic) and the residual is scaled by
/// `2^k`, `k = max(0, bitlength(Wp) + bitlength(Wq) − 60)`.
fn rejection_check_logits<T: FloatElement, D: FloatElement>(
    p: &[T],
    q: &[D],
    t: f32,
    d: Option<usize>,
    top_k: i32,
    top_p: f32,
    seed: u64,
) -> (bool, i32) {
    let resample_target =
        || logits::sample_logit_row(p, t, top_k, top_p, draw(seed, Purpose::Sample)) as i32;
    let target = Weighing::of(p, t);
    let KeptLogits::Kept(kept, wp_total) =
        logits::logit_kept_set(p, &target, top_k, top_p, Vec::new())
    else {
        // The target weighs nothing: no draft is accepted and the residual is empty.
        return (false, resample_target());
    };
    let draft = Weighing::of(q, t);
    let wq_total = logits::positive_tokens(q, &draft, &mut Vec::new());
    let wq = |v: usize| draft.weight(v, q[v].to_f32());
    let wp_d = d.map_or(0, |d| {
        kept.binary_search_by_key(&(d as u32), |w| w.id)
            .map_or(0, |i| kept[i].weight)
    });
    let wq_d = d.map_or(0, wq);
    let accepted = if wq_d == 0 {
        wp_d > 0
    } else {
        let u = draw(seed, Purpose::Accept) >> 32;
        wide_mul(u128::from(wq_d) * u128::from(wp_total), u)
            < wide_shl32(u128::from(wp_d) * u128::from(wq_total))
    };
    if let (true, Some(d)) = (accepted, d) {
        return (true, d as i32);
    }
    let bits = |w: u64| 64 - w.leading_zeros();
    let shift = (bits(wp_total) + bits(wq_total)).saturating_sub(60);
    let residual: Vec<logits::Weighted> = kept
        .iter()
        .map(|w| {
            let gap = (u128::from(w.weight) * u128::from(wq_total))
                .saturating_sub(u128::from(wq(w.id as usize)) * u128::from(wp_total));
            logits::Weighted {
                weight: (gap >> shift) as u64,
                ..*w
            }
        })
        .collect();
    let total: u64 = residual.iter().map(|w| w.weight).sum();
    let correction = (total > 0)
        .then(|| logits::draw_in(&residual, total, draw(seed, Purpose::Residual)))
        .flatten()
        .map_or_else(resample_target, |v| v as i32);
    (false, correction)
}

/// `a · u` as `(high, low)` with a base of `2^64` (`a < 2^124`, so `high` does not overflow).
fn wide_mul(a: u128, u: u64) -> (u128, u64) {
    const LOW: u128 = u64::MAX as u128;
    let low = (a & LOW) * u128::from(u);
    let high = (a >> 64) * u128::from(u) + (low >> 64);
    (high, (low & LOW) as u64)
}

/// `b · 2^32` as `(high, low)` with a base of `2^64`.
fn wide_shl32(b: u128) -> (u128, u64) {
    (b >> 32, ((b & 0xffff_ffff) << 32) as u64)
}

/// Samples `ρ[v] = floor(max(0, wp[v]·Wq − wq[v]·Wp) / 2^41)` with the RESIDUAL draw; `None` when
/// the residual is empty.
fn residual_sample<T: FloatElement, D: FloatElement>(
    p: &[T],
    q: &[D],
    kept: &Prefix,
    wp_total: u128,
    wq_total: u128,
    seed: u64,
) -> Option<i32> {
    let residual = |wp: u64, v: usize| -> u64 {
        let wq = u128::from(key_weight(rank_key(q[v].to_f32())));
        ((u128::from(wp) * wq_total).saturating_sub(wq * wp_total) >> 41) as u64
    };
    let mut member = kept.member();
    let mut total = 0u64;
    for (v, &x) in p.iter().enumerate() {
        let key = rank_key(x.to_f32());
        if member.admit(key) {
            total += residual(key_weight(key), v);
        }
    }
    if total == 0 {
        return None;
    }
    let t = scale_draw(draw(seed, Purpose::Residual), total);
    let mut member = kept.member();
    let mut cumulative = 0u64;
    for (v, &x) in p.iter().enumerate() {
        let key = rank_key(x.to_f32());
        if member.admit(key) {
            cumulative += residual(key_weight(key), v);
            if cumulative > t {
                return Some(v as i32);
            }
        }
    }
    Some(first_prob_in_rank(p) as i32)
}

pub(crate) fn verify_draft_tokens(
    dtypes: Option<(DType, DType)>,
    inputs: &VerifyInputs<'_>,
    out: &mut VerifyOutputs<'_>,
    params: &VerifyParams<'_>,
) -> Result<()> {
    match (inputs.strategy, dtypes) {
        (StrategyInputs::Rejection(_), Some((target, draft))) => {
            with_float!(target, Op::VerifyDraftTokens, T => {
                with_float!(draft, Op::VerifyDraftTokens, D => verify_slots::<T, D>(inputs, out, params))
            })
        }
        _ => verify_slots::<f32, f32>(inputs, out, params),
    }
}

fn verify_slots<T: FloatElement, D: FloatElement>(
    inputs: &VerifyInputs<'_>,
    out: &mut VerifyOutputs<'_>,
    params: &VerifyParams<'_>,
) -> Result<()> {
    let strategy = match inputs.strategy {
        StrategyInputs::Greedy { target_tokens } => Strategy::Greedy(slice::<i32>(target_tokens)?),
        StrategyInputs::TargetMatch { target_tokens } => {
            Strategy::TargetMatch(slice::<i32>(target_tokens)?)
        }
        StrategyInputs::TopP(c) => Strategy::TopP {
            ids: slice::<i32>(c.candidate_ids)?,
            scores: slice::<f32>(c.candidate_scores)?,
            lens: slice::<i32>(c.candidate_lens)?,
            candidates: c.candidates,
        },
        StrategyInputs::Rejection(r) => Strategy::Rejection {
            target: slice::<T>(r.target.matrix())?,
            draft: slice::<D>(r.draft)?,
            top_k: slice::<i32>(r.top_k)?,
            top_p: slice::<f32>(r.top_p)?,
            temperature: r.target.temperature().map(slice::<f32>).transpose()?,
            fallback: r.fallback.map(slice::<i32>).transpose()?,
            draft_index: r.draft_index.map(slice::<i32>).transpose()?,
        },
    };
    let context = Context::<T, D> {
        max_step_tokens: params.dims.max_step_tokens,
        real_bsz: params.dims.real_bsz,
        rows: params.rows,
        vocab: params.vocab,
        accept_all: params.accept_all && !params.reject_all,
        reject_all: params.reject_all,
        slots: VerifySlices::new(inputs)?,
        strategy,
    };
    let accept_tokens = slice_mut::<i32>(out.accept_tokens)?;
    let accept_num = slice_mut::<i32>(out.accept_num)?;
    accept_tokens
        .par_chunks_exact_mut(params.dims.max_step_tokens)
        .zip(accept_num.par_iter_mut())
        .enumerate()
        .for_each(|(b, (tokens, num))| *num = context.verify_slot(b, tokens));
    Ok(())
}

/// Runs a validated `verify_draft_tokens` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, facts) = call.parts();
    let dtypes = facts.rejection_dtypes;
    device.install(|| verify_draft_tokens(dtypes, inputs, out, params))
}
