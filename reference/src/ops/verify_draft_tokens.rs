//! `verify_draft_tokens` (`docs/semantics.md` §5.8): one slot at a time.

use ndarray::{ArrayView2, ArrayViewMut2};
use specula_backend_api::ops::verify_draft_tokens::OpCall;
use specula_backend_api::ops::{
    ScoresKind, StrategyInputs, VerifyFacts, VerifyInputs, VerifyOutputs, VerifyParams,
};
use specula_backend_api::rng::{Purpose, draw};
use specula_backend_api::{DType, Op, Result};

use super::top_k_top_p_sample::{Kept, kept_set, sample_row};
use crate::ReferenceDevice;
use crate::layout::{len_or_zero, token_index};
use crate::matrix::{ScoreMatrix, view, view_mut};
use crate::weights::{WeightedRow, draw_by_weight, weight};
use specula_backend_api::host::{VerifySlices, slice, slice_mut};

/// A target or draft row weighing this much is not a distribution (`2^41`).
const NOT_A_DISTRIBUTION: u64 = 1 << 41;

/// The residual `ρ[v] = floor(max(0, wp[v]·Wq − wq[v]·Wp) / 2^k)` of probability rows: `k = 41`.
const RESIDUAL_SHIFT: u32 = 41;

const OP: Op = Op::VerifyDraftTokens;

/// The strategy's per-row inputs.
enum Strategy<'a> {
    /// GREEDY or TARGET_MATCH: one target token per row.
    Target(&'a [i32]),
    /// TOPP: the candidates of every row.
    TopP {
        ids: ArrayView2<'a, i32>,
        scores: ArrayView2<'a, f32>,
        lens: &'a [i32],
    },
    /// REJECTION: target and draft rows, and the target's top-k / top-p filter.
    Rejection {
        target: ScoreMatrix<'a>,
        draft: ScoreMatrix<'a>,
        top_k: &'a [i32],
        top_p: &'a [f32],
        /// The target rows' fallbacks (`process_logits`), when given.
        fallback: Option<&'a [i32]>,
        /// The row of `draft` of each draft (§5.8.1); `None`: the dense layout.
        draft_index: Option<&'a [i32]>,
    },
}

/// The outcome of checking one draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The draft is emitted.
    Accept,
    /// Phase 1 ends; REJECTION brings its correction token, the others let phase 2 choose.
    Reject(Option<i32>),
}

/// Everything a slot reads.
struct Verifier<'a> {
    s: usize,
    real_bsz: usize,
    vocab: usize,
    accept_all: bool,
    reject_all: bool,
    draft_tokens: ArrayView2<'a, i32>,
    /// The layout and the slot state as host slices (the unpacking shared with the CPU backend).
    slots: VerifySlices<'a>,
    strategy: Strategy<'a>,
}

/// The tokens one slot emits, with the stop rules: an end token is kept and stops the slot; the
/// token that makes the count reach `max_dec_len` becomes `end_tokens[0]` and stops the slot.
struct Emitter<'a> {
    tokens: Vec<i32>,
    count: i64,
    max_dec_len: i64,
    end_tokens: &'a [i32],
    stopped: bool,
}

impl Emitter<'_> {
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
        self.tokens.push(token);
    }
}

impl Verifier<'_> {
    /// Output row `row` if it exists among the per-row inputs.
    fn row(&self, row: i64) -> Option<usize> {
        usize::try_from(row)
            .ok()
            .filter(|&r| r < self.slots.seeds.len())
    }

    /// Whether slot `b` emits anything: live, not stopped, not blocked, with tokens this step.
    fn tokens_this_step(&self, b: usize) -> usize {
        if b >= self.real_bsz || self.slots.stop_flags[b] != 0 || self.slots.is_block_step[b] != 0 {
            return 0;
        }
        len_or_zero(self.slots.seq_lens_this_time[b]).min(self.s)
    }

    /// Whether phase 1 runs for slot `b`: not a prefill, not reasoning, not `reject_all`.
    fn checks_drafts(&self, b: usize) -> bool {
        self.slots.seq_lens_encoder[b] <= 0
            && self.slots.reasoning_status[b] != 1
            && !self.reject_all
    }

    /// The tokens slot `b` emits.
    fn verify_slot(&self, b: usize) -> Vec<i32> {
        let n = self.tokens_this_step(b);
        if n == 0 {
            return Vec::new();
        }
        let base = i64::from(self.slots.cu_seqlens_q_output[b]);
        let mut out = Emitter {
            tokens: Vec::with_capacity(n),
            count: i64::from(self.slots.step_idx[b].max(0)),
            max_dec_len: i64::from(self.slots.max_dec_len[b]),
            end_tokens: self.slots.end_tokens,
            stopped: false,
        };
        let mut i = 0;
        let mut correction = None;
        if self.checks_drafts(b) {
            while i + 1 < n {
                let d = self.draft_tokens[[b, i + 1]];
                match self.check(b, i, d, self.row(base + i as i64)) {
                    Verdict::Accept => out.emit(d),
                    Verdict::Reject(c) => {
                        correction = c;
                        break;
                    }
                }
                if out.stopped {
                    return out.tokens;
                }
                i += 1;
            }
        }
        let token = correction.unwrap_or_else(|| self.phase2(self.row(base + i as i64)));
        // A token outside the vocabulary (a missing row, a caller's candidates) ends the slot.
        out.emit(match token_index(token, self.vocab) {
            Some(_) => token,
            None => self.slots.end_tokens[0],
        });
        out.tokens
    }

    /// Checks draft `d` (draft `i + 1` of slot `b`) against output row `row`.
    fn check(&self, b: usize, i: usize, d: i32, row: Option<usize>) -> Verdict {
        let in_vocab = token_index(d, self.vocab).is_some();
        if self.accept_all && in_vocab {
            return Verdict::Accept;
        }
        let accepted = match (&self.strategy, row) {
            (_, None) => false,
            (Strategy::Target(tokens), Some(r)) => in_vocab && d == tokens[r],
            (Strategy::TopP { ids, lens, .. }, Some(r)) => {
                let l = len_or_zero(lens[r]).min(ids.ncols());
                in_vocab && ids.row(r).iter().take(l).any(|&id| id == d)
            }
            (Strategy::Rejection { .. }, Some(r)) => return self.rejection(b, i, d, r),
        };
        if accepted {
            Verdict::Accept
        } else {
            Verdict::Reject(None)
        }
    }

    /// The phase-2 token from output row `row` (-1 when the row does not exist).
    fn phase2(&self, row: Option<usize>) -> i32 {
        let Some(r) = row else { return -1 };
        match &self.strategy {
            Strategy::Target(tokens) => tokens[r],
            Strategy::TopP { ids, scores, lens } => {
                let l = len_or_zero(lens[r]).min(ids.ncols());
                let members = ids
                    .row(r)
                    .into_iter()
                    .zip(scores.row(r))
                    .take(l)
                    .map(|(&id, &score)| (id, weight(score)));
                draw_by_weight(members, self.slots.seeds[r], Purpose::Candidate)
                    .unwrap_or(ids[[r, 0]])
            }
            Strategy::Rejection {
                target,
                top_k,
                top_p,
                fallback,
                ..
            } => match target.row(r) {
                Some(p) => sample_row(
                    &p,
                    top_k[r],
                    top_p[r],
                    self.slots.seeds[r],
                    fallback.map(|f| f[r]),
                ),
                None => -1,
            },
        }
    }

    /// The REJECTION test of draft `d` (draft `i + 1` of slot `b`) against target row `r`.
    fn rejection(&self, b: usize, i: usize, d: i32, r: usize) -> Verdict {
        let Strategy::Rejection {
            target,
            draft,
            top_k,
            top_p,
            fallback,
            draft_index,
        } = &self.strategy
        else {
            return Verdict::Reject(None);
        };
        let Some(p) = target.row(r) else {
            return Verdict::Reject(None);
        };
        let seed = self.slots.seeds[r];
        let fallback = fallback.map(|f| f[r]);
        let sample_target = || sample_row(&p, top_k[r], top_p[r], seed, fallback);
        // The draft's row: `b · (S − 1) + i` densely, else the index's entry; an entry outside
        // the draft rows rejects the draft like a row that is not a distribution (§5.8.1).
        let dense = b * (self.s - 1) + i;
        let q_row = match draft_index {
            None => Some(dense),
            Some(index) => usize::try_from(index[dense]).ok(),
        };
        let Some(q) = q_row.and_then(|row| draft.row_at(row, r)) else {
            return Verdict::Reject(Some(sample_target()));
        };
        // Only probability rows can fail to be a distribution (their weights are bounded by 2^40
        // each, not normalised); a logits row always is one.
        if !p.is_logits() && (p.total() >= NOT_A_DISTRIBUTION || q.total() >= NOT_A_DISTRIBUTION) {
            return Verdict::Reject(Some(sample_target()));
        }
        let wp = filtered_weights(&p, top_k[r], top_p[r]);
        let d = token_index(d, self.vocab);
        if accepts(&wp, q.weights(), d, draw(seed, Purpose::Accept)) {
            return Verdict::Accept;
        }
        let shift = residual_shift(&p, &wp, q.weights());
        let correction =
            residual_sample(&wp, q.weights(), shift, seed).unwrap_or_else(sample_target);
        Verdict::Reject(Some(correction))
    }
}

/// The target weights after the row's top-k / top-p filter: the row's weights on the kept set, 0
/// elsewhere.
fn filtered_weights(row: &WeightedRow, top_k: i32, top_p: f32) -> Vec<u64> {
    let mut wp = vec![0; row.len()];
    if let Kept::Prefix(kept) = kept_set(row, top_k, top_p) {
        for id in kept {
            wp[id] = row.weight(id);
        }
    }
    wp
}

/// The scale `k` of the residual: 41 for probability rows; for logits rows
/// `max(0, bitlength(Wp) + bitlength(Wq) − 60)`, so that `Σρ < 2^60`.
fn residual_shift(target: &WeightedRow, wp: &[u64], wq: &[u64]) -> u32 {
    if !target.is_logits() {
        return RESIDUAL_SHIFT;
    }
    let bits = |w: &[u64]| 64 - w.iter().sum::<u64>().leading_zeros();
    (bits(wp) + bits(wq)).saturating_sub(60)
}

/// The acceptance test with `U` = the high 32 bits of the ACCEPT draw: accept iff
/// `U · wq[d] · Wp < 2^32 · wp[d] · Wq`; if `wq[d] == 0`, iff `wp[d] > 0`. An id outside the
/// vocabulary (`d = None`) weighs 0 in both rows.
fn accepts(wp: &[u64], wq: &[u64], d: Option<usize>, accept_draw: u64) -> bool {
    let (wp_d, wq_d) = d.map_or((0, 0), |d| (wp[d], wq[d]));
    if wq_d == 0 {
        return wp_d > 0;
    }
    let total_p = u128::from(wp.iter().sum::<u64>());
    let total_q = u128::from(wq.iter().sum::<u64>());
    let u = accept_draw >> 32;
    // Each product of two weights or totals is below 2^100 (weights ≤ 2^40, totals ≤ V·2^40 ≤ 2^60),
    // but the comparison itself reaches 2^132: it is done in 192 bits.
    wide_mul(u128::from(wq_d) * total_p, u) < wide_shl32(u128::from(wp_d) * total_q)
}

/// `a · u` as `(high, low)` with a base of 2^64 (`a < 2^124`, so `high` does not overflow).
fn wide_mul(a: u128, u: u64) -> (u128, u64) {
    const LOW: u128 = u64::MAX as u128;
    let low = (a & LOW) * u128::from(u);
    let high = (a >> 64) * u128::from(u) + (low >> 64);
    (high, (low & LOW) as u64)
}

/// `b · 2^32` as `(high, low)` with a base of 2^64.
fn wide_shl32(b: u128) -> (u128, u64) {
    (b >> 32, ((b & 0xffff_ffff) << 32) as u64)
}

/// Samples the residual `ρ` (scale `2^shift`) with the RESIDUAL draw in ascending id order; `None`
/// when `Σρ == 0`.
fn residual_sample(wp: &[u64], wq: &[u64], shift: u32, seed: u64) -> Option<i32> {
    let total_p = u128::from(wp.iter().sum::<u64>());
    let total_q = u128::from(wq.iter().sum::<u64>());
    let residual = wp.iter().zip(wq).enumerate().map(|(v, (&p, &q))| {
        let gap = (u128::from(p) * total_q).saturating_sub(u128::from(q) * total_p);
        (v as i32, (gap >> shift) as u64)
    });
    draw_by_weight(residual, seed, Purpose::Residual)
}

/// The strategy inputs as views.
fn strategy<'a>(
    inputs: &VerifyInputs<'a>,
    facts: VerifyFacts,
    params: &VerifyParams<'_>,
) -> Result<Strategy<'a>> {
    let rows = params.rows;
    Ok(match (inputs.strategy, facts.rejection_dtypes) {
        (StrategyInputs::Greedy { target_tokens }, _)
        | (StrategyInputs::TargetMatch { target_tokens }, _) => {
            Strategy::Target(slice(target_tokens)?)
        }
        (StrategyInputs::TopP(c), _) => Strategy::TopP {
            ids: view(OP, c.candidate_ids, rows, c.candidates)?,
            scores: view(OP, c.candidate_scores, rows, c.candidates)?,
            lens: slice(c.candidate_lens)?,
        },
        (StrategyInputs::Rejection(r), Some((target_dtype, draft_dtype))) => Strategy::Rejection {
            target: ScoreMatrix::new(OP, kind(target_dtype, facts), &r.target, rows, params.vocab)?,
            draft: ScoreMatrix::of(
                OP,
                kind(draft_dtype, facts),
                r.draft,
                r.target.temperature(),
                facts.draft_rows,
                params.vocab,
            )?,
            top_k: slice(r.top_k)?,
            top_p: slice(r.top_p)?,
            fallback: r.fallback.map(slice).transpose()?,
            draft_index: r.draft_index.map(slice).transpose()?,
        },
        (StrategyInputs::Rejection(_), None) => {
            return Err(specula_backend_api::Error::Execution {
                backend: specula_backend_api::BackendKind::Cpu,
                what: OP.name().to_owned(),
                source: "REJECTION without the dtypes validation derives".into(),
            });
        }
    })
}

fn kind(dtype: DType, facts: VerifyFacts) -> ScoresKind {
    ScoresKind {
        dtype,
        logits: facts.logits,
    }
}

/// Verifies every slot and writes `accept_tokens` (-1 after the count) and `accept_num`.
pub(crate) fn verify_draft_tokens(
    facts: VerifyFacts,
    inputs: &VerifyInputs<'_>,
    out: &mut VerifyOutputs<'_>,
    params: &VerifyParams<'_>,
) -> Result<()> {
    let dims = params.dims;
    let s = dims.max_step_tokens;
    let verifier = Verifier {
        s,
        real_bsz: dims.real_bsz,
        vocab: params.vocab,
        accept_all: params.accept_all,
        reject_all: params.reject_all,
        draft_tokens: view(OP, inputs.draft_tokens, dims.max_bsz, s)?,
        slots: VerifySlices::new(inputs)?,
        strategy: strategy(inputs, facts, params)?,
    };
    let mut accept_tokens: ArrayViewMut2<'_, i32> =
        view_mut(OP, out.accept_tokens, dims.max_bsz, s)?;
    let accept_num = slice_mut::<i32>(out.accept_num)?;
    accept_tokens.fill(-1);
    for (b, num) in accept_num.iter_mut().enumerate() {
        let tokens = verifier.verify_slot(b);
        for (slot, &token) in accept_tokens.row_mut(b).iter_mut().zip(&tokens) {
            *slot = token;
        }
        *num = tokens.len() as i32;
    }
    Ok(())
}

/// Runs a validated `verify_draft_tokens` call (the front has checked every argument).
pub(crate) fn run(_device: &ReferenceDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, facts) = call.parts();
    verify_draft_tokens(*facts, inputs, out, params)
}

#[cfg(test)]
mod tests {
    use super::accepts;

    /// A full-vocabulary row of maximal weights: the acceptance products reach 2^129, past `u128`.
    #[test]
    fn acceptance_is_exact_beyond_128_bits() {
        let row = vec![1u64 << 40; 151_936];
        // Equal rows accept at every draw, the largest included.
        assert!(accepts(&row, &row, Some(7), u64::MAX));
        // Halving the target weight of the draft rejects draws at or above one half...
        let mut target = row.clone();
        target[7] = 1 << 39;
        let total = |r: &[u64]| r.iter().map(|&w| u128::from(w)).sum::<u128>();
        let ratio = |u: u64| u128::from(u) * total(&target) < (1u128 << 31) * total(&row);
        assert!(!accepts(&target, &row, Some(7), u64::MAX));
        // ...and accepts exactly the draws U with U · Wp < 2^31 · Wq.
        for u in [0u64, 1 << 30, (1 << 31) - 1, 1 << 31, (1 << 31) + 1] {
            assert_eq!(
                accepts(&target, &row, Some(7), u << 32),
                ratio(u),
                "U = {u}"
            );
        }
    }
}
