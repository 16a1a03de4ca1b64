//! Cases of `verify_draft_tokens` (`docs/semantics.md` §5.8): every strategy, mixed slot kinds,
//! stops by end token and by `max_dec_len`, stopped / blocked / reasoning slots, `accept_all` /
//! `reject_all`.

use serde::{Deserialize, Serialize};
use specula_backend_api::ops::*;
use specula_backend_api::{Buffer, DType, Strategy};

use super::Size;
use super::build_output_layout::batch_shapes;
use super::generate::{
    Batch, EDGE_SEEDS, Kind, Rng, batch_name, candidates_of, dims, f32s, float_tensor, garbage_i32s,
    i32s, logit_row, pick_temperature, prob_row, round_to, sample_index, softmax_f64, u8s, u64s,
};
use super::top_k_top_p_sample::{pick_top_k, pick_top_p};
use crate::{ConformanceError, Result};
use crate::case::{Dims, TensorSpec, Want, scores_specs};
use crate::cases::{Case, CaseParams};
use crate::exec::{HostLens, LensBuffers, OpCase, Runner, ScoreBuffers};

/// The parameters of a `verify_draft_tokens` case (the JSON header of a case file, beside `"op"`).
/// Inputs `draft_tokens`, `seq_lens_this_time`, `seq_lens_encoder`, `cu_seqlens_q_output`,
/// `stop_flags`, `is_block_step`, `reasoning_status`, `step_idx`, `max_dec_len`, `end_tokens`,
/// `seeds`, and per strategy `target_tokens` | `candidate_ids`, `candidate_scores`,
/// `candidate_lens` | `target_probs`, `draft_probs`, `top_k`, `top_p` (and `draft_index` with
/// compact draft rows).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Batch shape.
    pub dims: Dims,
    /// Output rows of the per-row inputs.
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// `greedy`, `target_match`, `topp` or `rejection`.
    pub strategy: String,
    /// Candidates per row (TOPP).
    pub candidates: usize,
    /// Accept every in-vocabulary draft.
    pub accept_all: bool,
    /// Accept no draft.
    pub reject_all: bool,
    /// REJECTION rows are logits (`target_logits`, `draft_logits`, `temperature`) instead of
    /// probabilities.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logits: bool,
    /// REJECTION's compact draft rows (`docs/semantics.md` §5.8.1): the draft holds this many
    /// rows and a `draft_index [max_bsz · (S − 1)]` names the row of each draft; `None`: dense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_rows: Option<usize>,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let d = &self.dims;
        let (n, rows, v) = (d.max_bsz, self.rows, self.vocab);
        let mut specs = vec![
            TensorSpec::i32("draft_tokens", n * d.max_step_tokens),
            TensorSpec::i32("seq_lens_this_time", n),
            TensorSpec::i32("seq_lens_encoder", n),
            TensorSpec::i32("cu_seqlens_q_output", d.real_bsz + 1),
            TensorSpec::new("stop_flags", Want::Is(DType::U8), n),
            TensorSpec::new("is_block_step", Want::Is(DType::U8), n),
            TensorSpec::i32("reasoning_status", n),
            TensorSpec::i32("step_idx", n),
            TensorSpec::i32("max_dec_len", n),
            TensorSpec::i32("end_tokens", 1).at_least(),
            TensorSpec::new("seeds", Want::Is(DType::U64), rows),
        ];
        let c = self.candidates;
        specs.extend(match self.strategy.as_str() {
            "topp" => vec![
                TensorSpec::i32("candidate_ids", rows * c),
                TensorSpec::new("candidate_scores", Want::Is(DType::F32), rows * c),
                TensorSpec::i32("candidate_lens", rows),
            ],
            "rejection" => {
                let names = ("target_probs", "target_logits");
                let mut rejection = scores_specs(self.logits, names, rows, v);
                let draft = if self.logits {
                    "draft_logits"
                } else {
                    "draft_probs"
                };
                let dense_rows = n * (d.max_step_tokens - 1);
                let draft_rows = self.draft_rows.unwrap_or(dense_rows);
                rejection.extend([
                    TensorSpec::new(draft, Want::Float, draft_rows * v),
                    TensorSpec::i32("top_k", rows),
                    TensorSpec::new("top_p", Want::Is(DType::F32), rows),
                    TensorSpec::i32("fallback", rows).optional(),
                ]);
                if self.draft_rows.is_some() {
                    rejection.push(TensorSpec::i32("draft_index", dense_rows));
                }
                rejection
            }
            _ => vec![TensorSpec::i32("target_tokens", rows)],
        });
        specs
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let device = r.device();
        let buffers = VerifyBuffers::upload(r, self)?;
        let fallback = r.optional("fallback")?;
        let inputs = buffers.inputs(fallback.as_ref())?;
        let mut out = verify_outputs(r, &self.dims)?;
        device.verify_draft_tokens(&inputs, &mut out, &buffers.params())?;
        Ok(())
    }
}

/// The uploaded inputs of a `verify_draft_tokens` case, every strategy but REJECTION's
/// `fallback` (the plain run uploads it as the op's input, the sharded run, `sharded.rs`, passes
/// it as a row extra).
pub(crate) struct VerifyBuffers<'p> {
    params: &'p Params,
    strategy: Strategy,
    host_lens: Option<HostLens>,
    draft_tokens: Buffer,
    lens: LensBuffers,
    /// `cu_seqlens_q_output`, then the slot state, then `seeds`.
    slots: [Buffer; 8],
    /// The strategy's per-row inputs, in the order of [`strategy_inputs`].
    extra: Vec<Buffer>,
    /// REJECTION's target and draft rows.
    rejection: Option<(ScoreBuffers, Buffer)>,
    draft_index: Option<Buffer>,
}

/// The names of a strategy's per-row inputs besides REJECTION's rows.
fn strategy_inputs(strategy: Strategy) -> &'static [&'static str] {
    match strategy {
        Strategy::Greedy | Strategy::TargetMatch => &["target_tokens"],
        Strategy::TopP => &["candidate_ids", "candidate_scores", "candidate_lens"],
        Strategy::Rejection => &["top_k", "top_p"],
    }
}

impl<'p> VerifyBuffers<'p> {
    /// Uploads the case's inputs.
    pub(crate) fn upload(r: &mut Runner<'_>, params: &'p Params) -> Result<Self> {
        let strategy: Strategy = params.strategy.parse()?;
        let host_lens = r.host_lens()?;
        let [draft_tokens] = r.inputs(["draft_tokens"])?;
        let lens = r.lens()?;
        let slots = r.inputs([
            "cu_seqlens_q_output",
            "stop_flags",
            "is_block_step",
            "reasoning_status",
            "step_idx",
            "max_dec_len",
            "end_tokens",
            "seeds",
        ])?;
        let extra = strategy_inputs(strategy)
            .iter()
            .map(|n| r.input(n))
            .collect::<Result<Vec<_>>>()?;
        let rejection = match strategy {
            Strategy::Rejection => {
                let logits = params.logits;
                let target = r.scores(logits, "target_probs", "target_logits")?;
                let draft = r.input(if logits {
                    "draft_logits"
                } else {
                    "draft_probs"
                })?;
                Some((target, draft))
            }
            _ => None,
        };
        let draft_index = r.optional("draft_index")?;
        Ok(VerifyBuffers {
            params,
            strategy,
            host_lens,
            draft_tokens,
            lens,
            slots,
            extra,
            rejection,
            draft_index,
        })
    }

    /// The op's inputs, REJECTION's rows with `fallback`.
    pub(crate) fn inputs<'a>(&'a self, fallback: Option<&'a Buffer>) -> Result<VerifyInputs<'a>> {
        let extra = &self.extra;
        let strategy = match (self.strategy, &self.rejection) {
            (Strategy::Greedy, _) => StrategyInputs::Greedy {
                target_tokens: &extra[0],
            },
            (Strategy::TargetMatch, _) => StrategyInputs::TargetMatch {
                target_tokens: &extra[0],
            },
            (Strategy::TopP, _) => StrategyInputs::TopP(CandidateInputs {
                candidate_ids: &extra[0],
                candidate_scores: &extra[1],
                candidate_lens: &extra[2],
                candidates: self.params.candidates,
            }),
            (Strategy::Rejection, Some((target, draft))) => {
                StrategyInputs::Rejection(RejectionInputs {
                    target: target.scores(),
                    draft,
                    top_k: &extra[0],
                    top_p: &extra[1],
                    fallback,
                    draft_index: self.draft_index.as_ref(),
                })
            }
            (Strategy::Rejection, None) => {
                return Err(ConformanceError::Format("REJECTION without rows".into()));
            }
        };
        let [cu_out, stop, blocked, reasoning, step_idx, max_dec_len, end_tokens, seeds] =
            &self.slots;
        Ok(VerifyInputs {
            draft_tokens: &self.draft_tokens,
            lens: self.lens.slot_lens(),
            cu_seqlens_q_output: cu_out,
            state: VerifySlotState {
                stop_flags: stop,
                is_block_step: blocked,
                reasoning_status: reasoning,
                step_idx,
                max_dec_len,
                end_tokens,
            },
            seeds,
            strategy,
        })
    }

    /// The op's parameters, with the host copies of the lengths unless the case is device-only.
    pub(crate) fn params(&self) -> VerifyParams<'_> {
        let p = self.params;
        VerifyParams {
            dims: p.dims.into(),
            rows: p.rows,
            vocab: p.vocab,
            accept_all: p.accept_all,
            reject_all: p.reject_all,
            host: self.host_lens.as_ref().map(HostLens::slot_lens),
        }
    }
}

/// The guarded outputs of a `verify_draft_tokens` case.
pub(crate) fn verify_outputs<'r>(r: &'r mut Runner<'_>, dims: &Dims) -> Result<VerifyOutputs<'r>> {
    let [accept_tokens, accept_num] = r.outputs([
        (
            "accept_tokens",
            DType::I32,
            &[dims.max_bsz, dims.max_step_tokens],
        ),
        ("accept_num", DType::I32, &[dims.max_bsz]),
    ])?;
    Ok(VerifyOutputs {
        accept_tokens,
        accept_num,
    })
}

/// `(dims, vocab, target dtype, draft dtype)` of the REJECTION cases from logits.
fn rejection_logits_shapes(size: Size) -> Vec<(Dims, usize, DType, DType)> {
    let (f32_, f16_, bf16_) = (DType::F32, DType::F16, DType::BF16);
    let mut shapes = vec![
        (dims(1, 1, 2), 97, f32_, f32_),
        (dims(3, 3, 4), 257, f32_, f32_),
        (dims(5, 4, 3), 1000, f16_, f16_),
        (dims(8, 8, 6), 129, bf16_, f32_),
        (dims(13, 11, 5), 4099, bf16_, bf16_),
        (dims(2, 2, 3), 32000, f32_, f32_),
        (dims(1, 1, 4), 151936, bf16_, bf16_),
    ];
    if size == Size::Full {
        shapes.extend([
            (dims(64, 64, 6), 151936, bf16_, bf16_),
            (dims(32, 32, 4), 128256, f32_, f32_),
        ]);
    }
    shapes
}

/// The strategy-independent inputs of a verify case.
#[derive(Clone, Debug)]
pub(crate) struct State {
    batch: Batch,
    vocab: usize,
    rows: usize,
    /// `[max_bsz, S]`: each slot's last token and drafts.
    pub(crate) draft_tokens: Vec<i32>,
    stop_flags: Vec<u8>,
    is_block_step: Vec<u8>,
    reasoning_status: Vec<i32>,
    step_idx: Vec<i32>,
    max_dec_len: Vec<i32>,
    /// The end tokens.
    pub(crate) end_tokens: Vec<i32>,
    /// `[rows]`: the per-row seeds.
    pub(crate) seeds: Vec<u64>,
}

impl State {
    /// `rows` output rows over `batch`, every slot running (nothing stopped, blocked or
    /// reasoning, far from `max_dec_len`), drafts of token 1, end token 2.
    pub(crate) fn new(batch: Batch, vocab: usize, rows: usize) -> Self {
        let d = batch.dims;
        State {
            batch,
            vocab,
            rows,
            draft_tokens: vec![1; d.max_bsz * d.max_step_tokens],
            stop_flags: vec![0; d.max_bsz],
            is_block_step: vec![0; d.max_bsz],
            reasoning_status: vec![0; d.max_bsz],
            step_idx: vec![0; d.max_bsz],
            max_dec_len: vec![1000; d.max_bsz],
            end_tokens: vec![2],
            seeds: (0..rows as u64).map(|r| 1000 + 4 * r).collect(),
        }
    }

    /// A realistic state: a few stopped, blocked and reasoning slots, some slots a few tokens away
    /// from `max_dec_len`, request seeds expanded per row.
    fn random(rng: &mut Rng, batch: Batch, vocab: usize, padded: bool) -> Self {
        let d = batch.dims;
        let rows = if padded {
            batch.capacity()
        } else {
            batch.t_out()
        };
        let mut s = State::new(batch, vocab, rows);
        s.draft_tokens = (0..d.max_bsz * d.max_step_tokens)
            .map(|_| rng.token(vocab))
            .collect();
        for b in 0..d.max_bsz {
            s.stop_flags[b] = u8::from(rng.chance(1, 20));
            s.is_block_step[b] = u8::from(rng.chance(1, 20));
            s.reasoning_status[b] = if rng.chance(2, 25) {
                1
            } else {
                rng.pick(&[0, 0, 2])
            };
            s.step_idx[b] = rng.below(500) as i32;
            s.max_dec_len[b] = if rng.chance(1, 5) {
                s.step_idx[b] + rng.range(1, 2 * d.max_step_tokens) as i32
            } else {
                4096
            };
        }
        s.end_tokens = (0..rng.range(1, 3)).map(|_| rng.token(vocab)).collect();
        let infer_seed: Vec<u64> = (0..d.max_bsz).map(|_| rng.seed()).collect();
        s.seeds = s.batch.row_seeds(&infer_seed, rows);
        s
    }

    /// Emits an end token now and then, so stops by end token happen.
    fn maybe_end(&self, rng: &mut Rng, token: i32) -> i32 {
        if rng.chance(3, 100) {
            self.end_tokens[rng.below(self.end_tokens.len())]
        } else {
            token
        }
    }

    /// The case of `strategy` with these inputs (the strategy's own inputs still to add).
    pub(crate) fn case(
        &self,
        name: String,
        strategy: Strategy,
        candidates: usize,
        accept_all: bool,
        reject_all: bool,
    ) -> Case {
        let d = self.batch.dims;
        let params = Params {
            dims: d,
            rows: self.rows,
            vocab: self.vocab,
            strategy: strategy.name().to_owned(),
            candidates,
            accept_all,
            reject_all,
            logits: false,
            draft_rows: None,
        };
        let case = Case::new(name, params);
        // Padded per-row inputs (rows > T_out) are what a runner without host copies passes;
        // with host copies the op requires rows == T_out.
        let case = match self.rows == self.batch.t_out() {
            true => case,
            false => case.device_only(),
        };
        self.batch
            .with_lens(case)
            .with("draft_tokens", i32s(&self.draft_tokens))
            .with(
                "cu_seqlens_q_output",
                i32s(&self.batch.cu_seqlens_q_output()),
            )
            .with("stop_flags", u8s(&self.stop_flags))
            .with("is_block_step", u8s(&self.is_block_step))
            .with("reasoning_status", i32s(&self.reasoning_status))
            .with("step_idx", i32s(&self.step_idx))
            .with("max_dec_len", i32s(&self.max_dec_len))
            .with("end_tokens", i32s(&self.end_tokens))
            .with("seeds", u64s(&self.seeds))
    }

    /// `accept_tokens`-shaped expectation, `[max_bsz, S]`.
    fn shaped(&self, data: &[i32]) -> crate::tensor::HostTensor {
        let d = self.batch.dims;
        crate::tensor::HostTensor::new(&[d.max_bsz, d.max_step_tokens], data)
    }

    /// The dense draft row `b · (S − 1) + i` of every draft that has its output row (the drafts
    /// REJECTION can test), in slot then draft order.
    fn tested_drafts(&self) -> Vec<usize> {
        // Position `b · S + i + 1` in `draft_tokens` is dense row `b · (S − 1) + i`.
        self.decode_rows()
            .into_iter()
            .map(|(b, _, pos)| pos - b - 1)
            .collect()
    }

    /// `(slot, output row, draft position in draft_tokens)` of every draft of every decode slot
    /// (row `base + i` checks the draft at position `i + 1`), for rows below `rows`.
    fn decode_rows(&self) -> Vec<(usize, usize, usize)> {
        let cu = self.batch.cu_seqlens_q_output();
        let s = self.batch.dims.max_step_tokens;
        let mut out = Vec::new();
        for (b, &base) in cu.iter().take(self.batch.dims.real_bsz).enumerate() {
            if self.batch.kind(b) == Kind::Decode {
                let t = (self.batch.this_time[b] as usize).min(s);
                for i in 0..t.saturating_sub(1) {
                    let row = base as usize + i;
                    if row < self.rows {
                        out.push((b, row, b * s + i + 1));
                    }
                }
            }
        }
        out
    }
}

/// GREEDY / TARGET_MATCH: target tokens per row, drafts that match them most of the time.
fn token_case(
    rng: &mut Rng,
    mut s: State,
    name: String,
    strategy: Strategy,
    accept_all: bool,
    reject_all: bool,
) -> Case {
    let target: Vec<i32> = (0..s.rows)
        .map(|_| {
            let t = rng.token(s.vocab);
            s.maybe_end(rng, t)
        })
        .collect();
    for (_, row, pos) in s.decode_rows() {
        s.draft_tokens[pos] = if rng.chance(4, 5) {
            target[row]
        } else {
            rng.token(s.vocab)
        };
    }
    s.case(name, strategy, 0, accept_all, reject_all)
        .with("target_tokens", i32s(&target))
}

/// TOPP: candidates as `top_p_candidates` writes them for rows with a tail beyond the first C.
fn topp_tensors(rng: &mut Rng, s: &State, c: usize) -> (Vec<i32>, Vec<f32>, Vec<i32>) {
    let (mut ids, mut scores, mut lens) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..s.rows {
        let valid = c.min(s.vocab);
        let extra = 1 + rng.below(8);
        let mut row = prob_row(rng, valid + extra);
        row.sort_by(|a, b| b.total_cmp(a));
        let tail: f32 = row[valid..].iter().sum();
        let row_scores = &row[..valid];
        // Distinct ids; equal scores list their ids ascending (the rank order).
        let mut row_ids: Vec<i32> = Vec::with_capacity(valid);
        while row_ids.len() < valid {
            let t = rng.token(s.vocab);
            if !row_ids.contains(&t) {
                row_ids.push(t);
            }
        }
        let mut k = 0;
        while k < valid {
            let mut end = k + 1;
            while end < valid && row_scores[end] == row_scores[k] {
                end += 1;
            }
            row_ids[k..end].sort_unstable();
            k = end;
        }
        let top_p = pick_top_p(rng);
        lens.push(candidates_of(row_scores, tail, top_p) as i32);
        ids.extend(row_ids);
        ids.extend(std::iter::repeat_n(-1, c - valid));
        scores.extend_from_slice(row_scores);
        scores.extend(std::iter::repeat_n(0.0, c - valid));
    }
    (ids, scores, lens)
}

fn topp_case(
    rng: &mut Rng,
    mut s: State,
    name: String,
    c: usize,
    accept_all: bool,
    reject_all: bool,
) -> Case {
    let (ids, scores, lens) = topp_tensors(rng, &s, c);
    for (_, row, pos) in s.decode_rows() {
        let n = lens[row] as usize;
        s.draft_tokens[pos] = if rng.chance(3, 4) {
            ids[row * c + rng.below(n)]
        } else {
            rng.token(s.vocab)
        };
    }
    s.case(name, Strategy::TopP, c, accept_all, reject_all)
        .with("candidate_ids", i32s(&ids))
        .with("candidate_scores", f32s(&scores))
        .with("candidate_lens", i32s(&lens))
}

/// REJECTION: target rows, draft rows close to them, drafts sampled from the draft rows.
fn rejection_case(rng: &mut Rng, mut s: State, name: String, dtypes: (DType, DType)) -> Case {
    let d = s.batch.dims;
    let v = s.vocab;
    let mut target = Vec::with_capacity(s.rows * v);
    for _ in 0..s.rows {
        target.extend(prob_row(rng, v));
    }
    let draft_rows = d.max_bsz * (d.max_step_tokens - 1);
    let mut draft = vec![1.0 / v as f32; draft_rows * v];
    for (b, row, pos) in s.decode_rows() {
        let i = pos - b * d.max_step_tokens - 1;
        let q = &mut draft[(b * (d.max_step_tokens - 1) + i) * v..][..v];
        let p = &target[row * v..(row + 1) * v];
        let mut sum = 0.0;
        for (qv, &pv) in q.iter_mut().zip(p) {
            *qv = pv * (0.3 + 1.4 * rng.unit() as f32);
            sum += *qv;
        }
        let boost = rng.below(v);
        q[boost] += sum * 0.2;
        sum *= 1.2;
        q.iter_mut().for_each(|x| *x /= sum);
        let q = round_to(dtypes.1, q);
        s.draft_tokens[pos] = sample_index(rng, &q) as i32;
    }
    let slots_k: Vec<i32> = (0..d.max_bsz).map(|_| pick_top_k(rng, v)).collect();
    let slots_p: Vec<f32> = (0..d.max_bsz).map(|_| pick_top_p(rng)).collect();
    let top_k = s.batch.expand(&slots_k, 0, s.rows);
    let top_p = s.batch.expand(&slots_p, 1.0, s.rows);
    s.case(name, Strategy::Rejection, 0, false, false)
        .with(
            "target_probs",
            float_tensor(dtypes.0, &[s.rows, v], &target),
        )
        .with(
            "draft_probs",
            float_tensor(dtypes.1, &[draft_rows, v], &draft),
        )
        .with("top_k", i32s(&top_k))
        .with("top_p", f32s(&top_p))
}

/// REJECTION from logits (`docs/semantics.md` §4b): target logits rows, draft logits close to them
/// (the target plus noise and a boosted token), the per-row temperature, drafts drawn from the
/// draft rows.
fn rejection_logits_case(
    rng: &mut Rng,
    mut s: State,
    name: String,
    dtypes: (DType, DType),
) -> Case {
    let d = s.batch.dims;
    let v = s.vocab;
    let mut target = Vec::with_capacity(s.rows * v);
    for _ in 0..s.rows {
        target.extend(logit_row(rng, v));
    }
    let temperature: Vec<f32> = (0..s.rows).map(|_| pick_temperature(rng)).collect();
    let draft_rows = d.max_bsz * (d.max_step_tokens - 1);
    let mut draft = vec![0.0f32; draft_rows * v];
    for (b, row, pos) in s.decode_rows() {
        let i = pos - b * d.max_step_tokens - 1;
        let q = &mut draft[(b * (d.max_step_tokens - 1) + i) * v..][..v];
        for (qv, &pv) in q.iter_mut().zip(&target[row * v..(row + 1) * v]) {
            *qv = pv + (rng.normal() * 0.7) as f32;
        }
        q[rng.below(v)] += 3.0;
        let q = round_to(dtypes.1, q);
        let t = temperature[row].clamp(1e-3, 1e3);
        let scaled: Vec<f32> = q.iter().map(|&x| x / t).collect();
        s.draft_tokens[pos] = sample_index(rng, &softmax_f64(&scaled)) as i32;
    }
    let slots_k: Vec<i32> = (0..d.max_bsz).map(|_| pick_top_k(rng, v)).collect();
    let slots_p: Vec<f32> = (0..d.max_bsz).map(|_| pick_top_p(rng)).collect();
    let top_k = s.batch.expand(&slots_k, 0, s.rows);
    let top_p = s.batch.expand(&slots_p, 1.0, s.rows);
    let mut case = s
        .case(name, Strategy::Rejection, 0, false, false)
        .with(
            "target_logits",
            float_tensor(dtypes.0, &[s.rows, v], &target),
        )
        .with(
            "draft_logits",
            float_tensor(dtypes.1, &[draft_rows, v], &draft),
        )
        .with("temperature", f32s(&temperature))
        .with("top_k", i32s(&top_k))
        .with("top_p", f32s(&top_p));
    if let CaseParams::VerifyDraftTokens(params) = &mut case.params {
        params.logits = true;
    }
    case
}

/// REJECTION with target rows that weigh nothing (every third row all −inf logits, or all-zero
/// probabilities) and a `fallback` input (`docs/semantics.md` §4c): such a row's target sample is
/// its fallback — -1 (the slot emits `end_tokens[0]` and stops), an id, or one outside the
/// vocabulary.
fn rejection_fallback_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for logits in [false, true] {
        let mut rng = Rng::new("verify/rejection_fallback", u64::from(logits));
        let d = dims(6, 5, 4);
        let vocab = 97;
        let batch = Batch::random(&mut rng, d, 30);
        let state = State::random(&mut rng, batch, vocab, false);
        let rows = state.rows;
        let kind = if logits { "logits" } else { "probs" };
        let name = format!("rejection_fallback_{kind}");
        let dtypes = (DType::F32, DType::F32);
        let mut case = match logits {
            true => rejection_logits_case(&mut rng, state, name, dtypes),
            false => rejection_case(&mut rng, state, name, dtypes),
        };
        let target = if logits {
            "target_logits"
        } else {
            "target_probs"
        };
        let empty = if logits { f32::NEG_INFINITY } else { 0.0 };
        if let Some(t) = case.inputs.get_mut(target)
            && let Ok(mut values) = t.to_vec::<f32>()
        {
            for r in (0..rows).step_by(3) {
                values[r * vocab..(r + 1) * vocab].fill(empty);
            }
            *t = float_tensor(DType::F32, &[rows, vocab], &values);
        }
        let fallback: Vec<i32> = (0..rows).map(|r| [-1, 5, 96, 200, -7][r % 5]).collect();
        out.push(case.with("fallback", i32s(&fallback)));
    }
    out
}

/// The compact form of the dense REJECTION `case` (`docs/semantics.md` §5.8.1): only the draft
/// rows of `tested` (dense rows `b · (S − 1) + i`), in a shuffled order, with a `draft_index`
/// naming each; the other index entries are garbage the op never reads. A dense case whose
/// drafts are all untested keeps its first row.
pub(crate) fn compact(rng: &mut Rng, mut case: Case, tested: &[usize], name: String) -> Case {
    let CaseParams::VerifyDraftTokens(params) = &mut case.params else {
        return case;
    };
    let d = params.dims;
    let dense_rows = d.max_bsz * (d.max_step_tokens - 1);
    let mut order = if tested.is_empty() {
        vec![0]
    } else {
        tested.to_vec()
    };
    for k in (1..order.len()).rev() {
        order.swap(k, rng.below(k + 1));
    }
    let n = order.len() as i32;
    let mut index: Vec<i32> = (0..dense_rows)
        .map(|_| rng.pick(&[-1, n, n + 7, i32::MIN, i32::MAX]))
        .collect();
    for (row, &dense) in order.iter().enumerate() {
        index[dense] = row as i32;
    }
    params.draft_rows = Some(order.len());
    let vocab = params.vocab;
    let draft_name = match params.logits {
        true => "draft_logits",
        false => "draft_probs",
    };
    if let Some(t) = case.inputs.get_mut(draft_name) {
        let row_bytes = vocab * t.dtype.size_bytes();
        let bytes = order
            .iter()
            .flat_map(|&r| t.bytes[r * row_bytes..(r + 1) * row_bytes].iter().copied())
            .collect();
        *t = crate::tensor::HostTensor {
            dtype: t.dtype,
            shape: vec![order.len(), vocab],
            bytes,
        };
    }
    case.name = name;
    case.with("draft_index", i32s(&index))
}

/// Pairs `(dense, compact)` of REJECTION cases (probabilities and logits, the compact rows
/// shuffled) that must emit the same tokens.
pub(crate) fn compact_pairs() -> Vec<(Case, Case)> {
    let (f32_, f16_, bf16_) = (DType::F32, DType::F16, DType::BF16);
    let shapes = [
        (dims(3, 3, 4), 97, f32_, f32_, false),
        (dims(8, 8, 6), 257, f32_, f32_, false),
        (dims(13, 11, 5), 129, bf16_, f16_, false),
        (dims(4, 4, 3), 1000, f32_, bf16_, false),
        (dims(3, 3, 4), 151936, f32_, f32_, false),
        (dims(5, 4, 3), 1000, f16_, f16_, true),
        (dims(8, 8, 6), 129, bf16_, f32_, true),
    ];
    let mut out = Vec::new();
    for (i, (d, vocab, t, q, logits)) in shapes.into_iter().enumerate() {
        let mut rng = Rng::new("verify/rejection/compact", i as u64);
        let batch = Batch::random(&mut rng, d, 20);
        let state = State::random(&mut rng, batch, vocab, i % 3 == 2);
        let tested = state.tested_drafts();
        let kind = if logits { "logits_" } else { "" };
        let shape = format!("{kind}{}_{}_v{vocab}", dtypes_name(t, q), batch_name(&d));
        let dense_name = format!("rejection::dense_{shape}");
        let dense = match logits {
            true => rejection_logits_case(&mut rng, state, dense_name, (t, q)),
            false => rejection_case(&mut rng, state, dense_name, (t, q)),
        };
        let name = format!("rejection::compact_{shape}");
        let compact = compact(&mut rng, dense.clone(), &tested, name);
        out.push((dense, compact));
    }
    out
}

/// The compact REJECTION cases: every compact twin of [`compact_pairs`], and one whose index
/// holds negative and too large entries for tested drafts (`docs/semantics.md` §5.8.1).
fn compact_cases() -> Vec<Case> {
    let mut out: Vec<Case> = compact_pairs().into_iter().map(|(_, c)| c).collect();
    let Some(mut case) = out.first().cloned() else {
        return out;
    };
    let mut rng = Rng::new("verify/rejection/compact_out_of_range", 0);
    let n = match &case.params {
        CaseParams::VerifyDraftTokens(p) => p.draft_rows.unwrap_or(0) as i32,
        _ => 0,
    };
    if let Some(t) = case.inputs.get_mut("draft_index")
        && let Ok(mut index) = t.to_vec::<i32>()
    {
        for entry in index.iter_mut().filter(|e| (0..n).contains(*e)).step_by(3) {
            *entry = rng.pick(&[-1, -n, n, n + 1, i32::MIN, i32::MAX]);
        }
        *t = i32s(&index);
    }
    case.name = "rejection::compact_index_out_of_range".into();
    out.push(case);
    out
}

fn dtypes_name(t: DType, q: DType) -> String {
    if t == q {
        t.to_string()
    } else {
        format!("{t}x{q}")
    }
}

/// Every case of `verify_draft_tokens`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    out.extend(rejection_fallback_cases());
    out.extend(compact_cases());
    let vocabs = [32000, 128256, 151936, 97];
    for (i, d) in batch_shapes(size).into_iter().enumerate() {
        let vocab = vocabs[i % vocabs.len()];
        for strategy in [Strategy::Greedy, Strategy::TargetMatch, Strategy::TopP] {
            let mut rng = Rng::new(&format!("verify/{strategy}"), i as u64);
            let batch = Batch::random(&mut rng, d, 30);
            let padded = i % 3 == 2;
            let state = State::random(&mut rng, batch, vocab, padded);
            let mut name = format!("{strategy}::{}", batch_name(&d));
            if padded {
                name.push_str("_padded");
            }
            let c = [8, 1, 20, 128][i % 4];
            out.push(match strategy {
                Strategy::TopP => {
                    topp_case(&mut rng, state, format!("{name}_c{c}"), c, false, false)
                }
                _ => token_case(&mut rng, state, name, strategy, false, false),
            });
        }
    }
    // The flags.
    for (strategy, accept_all, reject_all) in [
        (Strategy::Greedy, true, false),
        (Strategy::TargetMatch, false, true),
        (Strategy::TargetMatch, true, true),
        (Strategy::TopP, true, false),
    ] {
        let d = dims(13, 12, 5);
        let mut rng = Rng::new(
            &format!("verify/flags/{strategy}"),
            u64::from(accept_all) * 2 + u64::from(reject_all),
        );
        let batch = Batch::random(&mut rng, d, 10);
        let state = State::random(&mut rng, batch, 1000, false);
        let flags = match (accept_all, reject_all) {
            (true, true) => "accept_all_reject_all",
            (true, false) => "accept_all",
            _ => "reject_all",
        };
        let name = format!("{strategy}::{}_{flags}", batch_name(&d));
        out.push(match strategy {
            Strategy::TopP => topp_case(&mut rng, state, name, 8, accept_all, reject_all),
            _ => token_case(&mut rng, state, name, strategy, accept_all, reject_all),
        });
    }
    let (f32_, f16_, bf16_) = (DType::F32, DType::F16, DType::BF16);
    let mut rejection = vec![
        (dims(1, 1, 1), 97, f32_, f32_),
        (dims(3, 3, 4), 97, f32_, f32_),
        (dims(3, 3, 4), 1000, f16_, f16_),
        (dims(5, 3, 2), 4099, bf16_, bf16_),
        (dims(8, 8, 6), 257, f32_, f32_),
        (dims(4, 4, 3), 1000, f32_, bf16_),
        (dims(13, 11, 5), 129, bf16_, f16_),
        (dims(32, 32, 8), 97, f16_, f32_),
        (dims(1, 1, 2), 32000, f32_, f32_),
        (dims(2, 2, 2), 128256, f16_, f16_),
        (dims(1, 1, 3), 151936, bf16_, bf16_),
    ];
    if size == Size::Full {
        rejection.extend([
            (dims(64, 64, 6), 151936, bf16_, bf16_),
            (dims(16, 16, 6), 128256, f32_, f32_),
            (dims(256, 256, 2), 32000, f16_, f16_),
        ]);
    }
    for (i, (d, vocab, t, q)) in rejection.into_iter().enumerate() {
        let mut rng = Rng::new("verify/rejection", i as u64);
        let batch = Batch::random(&mut rng, d, 20);
        let state = State::random(&mut rng, batch, vocab, i % 4 == 3);
        let name = format!(
            "rejection::{}_{}_v{vocab}{}",
            dtypes_name(t, q),
            batch_name(&d),
            if i % 4 == 3 { "_padded" } else { "" }
        );
        out.push(rejection_case(&mut rng, state, name, (t, q)));
    }
    for (i, (d, vocab, t, q)) in rejection_logits_shapes(size).into_iter().enumerate() {
        let mut rng = Rng::new("verify/rejection/logits", i as u64);
        let batch = Batch::random(&mut rng, d, 20);
        let state = State::random(&mut rng, batch, vocab, false);
        let name = format!(
            "rejection::logits_{}_{}_v{vocab}",
            dtypes_name(t, q),
            batch_name(&d)
        );
        out.push(rejection_logits_case(&mut rng, state, name, (t, q)));
    }
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    let mut out = Vec::new();

    // GREEDY: accept while equal, then the target token; a prefill emits its row's target.
    let mut s = State::new(
        Batch::new(dims(3, 3, 4), vec![4, 3, 2], vec![0, 3, 0]),
        100,
        7,
    );
    s.draft_tokens = vec![1, 5, 6, 7, 0, 0, 0, 0, 3, 8, 0, 0];
    out.push(
        s.case(
            "golden::greedy_accept_then_correct".into(),
            Strategy::Greedy,
            0,
            false,
            false,
        )
        .with("target_tokens", i32s(&[5, 6, 9, 11, 12, 8, 13]))
        .expect(
            "accept_tokens",
            s.shaped(&[5, 6, 9, -1, 12, -1, -1, -1, 8, 13, -1, -1]),
        )
        .expect("accept_num", i32s(&[3, 1, 2])),
    );

    // Stops: an accepted end token; max_dec_len replaces the token that reaches it; stopped and
    // blocked slots emit nothing; a reasoning slot skips phase 1; max_dec_len 0.
    let mut s = State::new(
        Batch::new(dims(6, 6, 4), vec![4, 4, 4, 2, 3, 3], vec![0; 6]),
        50,
        20,
    );
    s.end_tokens = vec![2, 3];
    s.draft_tokens = [
        [1, 10, 3, 11],
        [1, 20, 21, 22],
        [1, 5, 5, 5],
        [1, 5, 0, 0],
        [1, 30, 31, 0],
        [1, 40, 41, 0],
    ]
    .concat();
    s.step_idx = vec![0, 5, 0, 0, 0, 0];
    s.max_dec_len = vec![100, 7, 100, 100, 100, 0];
    s.stop_flags = vec![0, 0, 1, 0, 0, 0];
    s.is_block_step = vec![0, 0, 0, 7, 0, 0];
    s.reasoning_status = vec![0, 0, 0, 0, 1, 0];
    let targets = [
        10, 3, 11, 12, 20, 21, 22, 23, 5, 5, 5, 5, 5, 5, 30, 31, 32, 40, 41, 42,
    ];
    out.push(
        s.case(
            "golden::target_match_stop_rules".into(),
            Strategy::TargetMatch,
            0,
            false,
            false,
        )
        .with("target_tokens", i32s(&targets))
        .expect(
            "accept_tokens",
            s.shaped(
                &[
                    [10, 3, -1, -1],
                    [20, 2, -1, -1],
                    [-1; 4],
                    [-1; 4],
                    [30, -1, -1, -1],
                    [2, -1, -1, -1],
                ]
                .concat(),
            ),
        )
        .expect("accept_num", i32s(&[2, 2, 0, 0, 1, 1])),
    );

    // accept_all accepts in-vocabulary drafts only; an accepted end token stops the slot.
    let mut s = State::new(Batch::new(dims(2, 2, 4), vec![4, 3], vec![0, 0]), 50, 7);
    s.draft_tokens = vec![1, 10, 60, 12, 1, 2, 5, 0];
    out.push(
        s.case(
            "golden::accept_all_in_vocab_only".into(),
            Strategy::Greedy,
            0,
            true,
            false,
        )
        .with("target_tokens", i32s(&[0, 0, 0, 7, 9, 9, 9]))
        .expect("accept_tokens", s.shaped(&[10, 0, -1, -1, 2, -1, -1, -1]))
        .expect("accept_num", i32s(&[2, 1])),
    );

    // reject_all wins over accept_all: phase 2 only.
    let mut s = State::new(Batch::new(dims(2, 2, 4), vec![4, 6], vec![0, 6]), 50, 5);
    s.draft_tokens = vec![1, 10, 11, 12, 0, 0, 0, 0];
    out.push(
        s.case(
            "golden::reject_all_wins".into(),
            Strategy::TargetMatch,
            0,
            true,
            true,
        )
        .with("target_tokens", i32s(&[10, 11, 12, 13, 44]))
        .expect("accept_tokens", s.shaped(&[10, -1, -1, -1, 44, -1, -1, -1]))
        .expect("accept_num", i32s(&[1, 1])),
    );

    // TOPP: membership in ids[0..lens) (lens clamped to C); zero-weight candidates give candidate 0;
    // an out-of-vocabulary candidate 0 ends the slot with end_tokens[0].
    let mut s = State::new(
        Batch::new(dims(3, 3, 3), vec![3, 2, 1], vec![0, 0, 0]),
        50,
        6,
    );
    s.draft_tokens = vec![1, 7, 9, 1, 8, 0, 1, 0, 0];
    let ids = [
        [5, 7, 8],
        [9, 4, -1],
        [11, 12, 13],
        [5, 7, 8],
        [1, 2, 3],
        [-5, 3, 4],
    ]
    .concat();
    let scores = [
        [0.5, 0.3, 0.1],
        [0.6, 0.1, 0.0],
        [0.0; 3],
        [0.6, 0.0, 0.3],
        [0.3; 3],
        [0.0; 3],
    ]
    .concat();
    out.push(
        s.case(
            "golden::topp_membership_and_fallbacks".into(),
            Strategy::TopP,
            3,
            false,
            false,
        )
        .with("candidate_ids", i32s(&ids))
        .with("candidate_scores", f32s(&scores))
        .with("candidate_lens", i32s(&[2, 99, 3, 2, 3, -2]))
        .expect("accept_tokens", s.shaped(&[7, 9, 11, 5, -1, -1, 2, -1, -1]))
        .expect("accept_num", i32s(&[3, 1, 1])),
    );

    // REJECTION with one-hot rows, where no draw can change the answer: a draft equal to the
    // target is accepted; a draft the target gives 0 is rejected and the residual is the target's
    // token; a draft row of weight 0 accepts a draft the target supports.
    let v = 8;
    let one_hot =
        |t: usize| -> Vec<f32> { (0..v).map(|x| if x == t { 1.0 } else { 0.0 }).collect() };
    let mut s = State::new(
        Batch::new(dims(3, 3, 3), vec![3, 2, 2], vec![0, 0, 0]),
        v,
        7,
    );
    s.draft_tokens = vec![1, 3, 3, 1, 6, 0, 1, 5, 0];
    let target: Vec<f32> = [3, 3, 3, 4, 5, 5, 7]
        .iter()
        .flat_map(|&t| one_hot(t))
        .collect();
    let draft: Vec<f32> = [
        one_hot(3),
        one_hot(3),
        one_hot(6),
        vec![0.0; v],
        vec![0.0; v],
        vec![0.0; v],
    ]
    .concat();
    for (t, q) in [(DType::F32, DType::F32), (DType::BF16, DType::F16)] {
        out.push(
            s.case(
                format!("golden::rejection_one_hot_{}", dtypes_name(t, q)),
                Strategy::Rejection,
                0,
                false,
                false,
            )
            .with("target_probs", float_tensor(t, &[7, v], &target))
            .with("draft_probs", float_tensor(q, &[6, v], &draft))
            .with("top_k", i32s(&[0; 7]))
            .with("top_p", f32s(&[1.0; 7]))
            .expect("accept_tokens", s.shaped(&[3, 3, 3, 4, -1, -1, 5, 7, -1]))
            .expect("accept_num", i32s(&[3, 1, 2])),
        );
    }
    out.extend(golden_fallbacks());
    out
}

/// Fallbacks an outside check found one backend getting wrong: a negative `cu_seqlens_q_output`
/// whose rows come back into range, and REJECTION with an out-of-vocabulary draft.
fn golden_fallbacks() -> Vec<Case> {
    let mut out = Vec::new();
    // base = -1: row base + 0 is missing (the draft is accepted anyway under accept_all), row
    // base + 1 = 0 exists and gives the bonus token.
    let mut s = State::new(Batch::new(dims(1, 1, 2), vec![2], vec![0]), 100, 1);
    s.draft_tokens = vec![7, 2];
    s.end_tokens = vec![3];
    out.push(
        s.case(
            "golden::negative_base_back_in_range".into(),
            Strategy::Greedy,
            0,
            true,
            false,
        )
        .device_only()
        .with("cu_seqlens_q_output", i32s(&[-1, 1]))
        .with("target_tokens", i32s(&[1]))
        .expect("accept_tokens", s.shaped(&[2, 1]))
        .expect("accept_num", i32s(&[2])),
    );
    // An id outside [0, V) weighs 0 in both rows: rejected, corrected from the residual with the
    // RESIDUAL draw (`docs/semantics.md` §5.8), not from a plain SAMPLE draw of the target.
    let target = [0.1, 0.2, 0.3, 0.4, 0.25, 0.25, 0.25, 0.25];
    for (name, draft, seeds, expected, accept_all) in [
        ("past_vocab", 4, [0u64, 4], 2, false),
        ("negative", -1, [1, 5], 1, false),
        // accept_all accepts only ids in [0, V): the out-of-vocabulary draft is still tested.
        ("past_vocab_accept_all", 4, [0u64, 4], 2, true),
    ] {
        let mut s = State::new(Batch::new(dims(1, 1, 2), vec![2], vec![0]), 4, 2);
        s.draft_tokens = vec![1, draft];
        s.end_tokens = vec![3];
        s.seeds = seeds.to_vec();
        out.push(
            s.case(
                format!("golden::rejection_out_of_vocab_draft_{name}"),
                Strategy::Rejection,
                0,
                accept_all,
                false,
            )
            .with("target_probs", f32s(&target))
            .with("draft_probs", f32s(&[0.7, 0.1, 0.1, 0.1]))
            .with("top_k", i32s(&[0, 0]))
            .with("top_p", f32s(&[1.0, 1.0]))
            .expect("accept_tokens", s.shaped(&[expected, -1]))
            .expect("accept_num", i32s(&[1])),
        );
    }
    out
}

fn hostile() -> Vec<Case> {
    let mut out = Vec::new();
    let d: Dims = dims(16, 14, 5);
    let vocab = 1000;
    for strategy in Strategy::ALL {
        let mut rng = Rng::new(&format!("verify/hostile/{strategy}"), 0);
        let batch = Batch::random(&mut rng, d, 10);
        let state = State::random(&mut rng, batch, vocab, false);
        let base = match strategy {
            Strategy::TopP => topp_case(&mut rng, state.clone(), String::new(), 8, false, false),
            Strategy::Rejection => rejection_case(
                &mut rng,
                state.clone(),
                String::new(),
                (DType::F32, DType::F32),
            ),
            _ => token_case(
                &mut rng,
                state.clone(),
                String::new(),
                strategy,
                false,
                false,
            ),
        };
        let named = |suffix: &str| {
            let mut c = base.clone();
            c.name = format!("hostile::{strategy}_{suffix}");
            c
        };
        let rows = state.rows;
        out.push(named("garbage_offsets").with(
            "cu_seqlens_q_output",
            i32s(&garbage_i32s(&mut rng, d.real_bsz + 1, rows + 4)),
        ));
        out.push(
            named("garbage_lengths")
                .with(
                    "seq_lens_this_time",
                    i32s(&garbage_i32s(&mut rng, d.max_bsz, 2 * d.max_step_tokens)),
                )
                .with(
                    "seq_lens_encoder",
                    i32s(&garbage_i32s(&mut rng, d.max_bsz, 3)),
                ),
        );
        let mut ids = garbage_i32s(&mut rng, d.max_bsz * d.max_step_tokens, vocab + 10);
        for (k, t) in ids.iter_mut().enumerate() {
            if k % 3 == 0 {
                *t = -(rng.below(5) as i32) - 1;
            }
        }
        out.push(named("bad_draft_ids").with("draft_tokens", i32s(&ids)));
        let n = d.max_bsz;
        out.push(
            named("bad_slot_state")
                .with(
                    "stop_flags",
                    u8s(&(0..n).map(|k| [0, 0, 2, 255][k % 4]).collect::<Vec<u8>>()),
                )
                .with(
                    "is_block_step",
                    u8s(&(0..n)
                        .map(|k| [0, 0, 0, 128][(k + 1) % 4])
                        .collect::<Vec<u8>>()),
                )
                .with("reasoning_status", i32s(&garbage_i32s(&mut rng, n, 2)))
                .with("step_idx", i32s(&garbage_i32s(&mut rng, n, 20)))
                .with("max_dec_len", i32s(&garbage_i32s(&mut rng, n, 20)))
                .with("end_tokens", i32s(&[-1, i32::MAX, 5]))
                .with(
                    "seeds",
                    u64s(
                        &(0..rows)
                            .map(|r| EDGE_SEEDS[r % EDGE_SEEDS.len()])
                            .collect::<Vec<_>>(),
                    ),
                ),
        );
        match strategy {
            Strategy::Greedy | Strategy::TargetMatch => {
                out.push(named("bad_target_ids").with(
                    "target_tokens",
                    i32s(&garbage_i32s(&mut rng, rows, vocab + 10)),
                ));
            }
            Strategy::TopP => {
                let c = 8;
                let ids = garbage_i32s(&mut rng, rows * c, vocab + 10);
                let scores: Vec<f32> = (0..rows * c)
                    .map(|_| {
                        rng.pick(&[
                            f32::NAN,
                            f32::INFINITY,
                            -1.0,
                            0.0,
                            0.5,
                            2.0,
                            f32::MIN_POSITIVE,
                            -0.0,
                        ])
                    })
                    .collect();
                out.push(
                    named("bad_candidates")
                        .with("candidate_ids", i32s(&ids))
                        .with("candidate_scores", f32s(&scores))
                        .with("candidate_lens", i32s(&garbage_i32s(&mut rng, rows, 2 * c))),
                );
            }
            Strategy::Rejection => {
                let draft_rows = d.max_bsz * (d.max_step_tokens - 1);
                for (dtype, tag) in [
                    (DType::F32, "f32"),
                    (DType::F16, "f16"),
                    (DType::BF16, "bf16"),
                ] {
                    let bad = |rows: usize, rng: &mut Rng| -> Vec<f32> {
                        let mut all = Vec::with_capacity(rows * vocab);
                        for r in 0..rows {
                            let mut row = prob_row(rng, vocab);
                            match r % 7 {
                                0 => row.iter_mut().step_by(3).for_each(|x| *x = f32::NAN),
                                1 => row[rng.below(vocab)] = f32::INFINITY,
                                2 => row.iter_mut().for_each(|x| *x = -*x),
                                3 => row.fill(0.0),
                                4 => row.fill(1.0),
                                5 => row
                                    .iter_mut()
                                    .for_each(|x| *x = f32::from_bits(rng.next_u64() as u32)),
                                _ => {}
                            }
                            all.extend(row);
                        }
                        all
                    };
                    let target = bad(rows, &mut rng);
                    let draft = bad(draft_rows, &mut rng);
                    out.push(
                        named(&format!("bad_rows_{tag}"))
                            .with("target_probs", float_tensor(dtype, &[rows, vocab], &target))
                            .with(
                                "draft_probs",
                                float_tensor(dtype, &[draft_rows, vocab], &draft),
                            )
                            .with("top_k", i32s(&garbage_i32s(&mut rng, rows, vocab + 5)))
                            .with(
                                "top_p",
                                f32s(
                                    &(0..rows)
                                        .map(|_| {
                                            rng.pick(&[f32::NAN, -1.0, 0.0, 3.0, 1e-30, 0.5, 1.0])
                                        })
                                        .collect::<Vec<_>>(),
                                ),
                            ),
                    );
                }
            }
        }
    }
    // Fewer per-row inputs than the layout's T_out: the missing rows read as absent.
    let mut rng = Rng::new("verify/hostile/short_rows", 0);
    let batch = Batch::new(dims(4, 4, 4), vec![4, 4, 1, 3], vec![0, 0, 5, 0]);
    let mut s = State::random(&mut rng, batch, 500, false);
    s.rows = 5;
    s.seeds.truncate(5);
    out.push(token_case(
        &mut rng,
        s,
        "hostile::rows_below_t_out".into(),
        Strategy::TargetMatch,
        false,
        false,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::compact_pairs;
    use crate::cases::run_case;
    use specula_backend_api::Device;

    /// The compact draft rows give the dense layout's tokens, on the reference and on the CPU.
    #[test]
    fn compact_rejection_rows_emit_the_dense_tokens() {
        let reference = specula_reference::ReferenceDevice::new();
        let cpu = specula_backend_cpu::CpuDevice::new().expect("a CPU device");
        let devices: [&dyn Device; 2] = [&reference, &cpu];
        let mut accepted = 0;
        for (dense, compact) in compact_pairs() {
            for device in devices {
                let dense_out = run_case(device, &dense).expect("the dense case runs");
                let compact_out = run_case(device, &compact).expect("the compact case runs");
                assert_eq!(dense_out.tensors, compact_out.tensors, "{}", compact.name);
                let nums = dense_out.tensors["accept_num"].to_vec::<i32>();
                accepted += nums.expect("i32 accept_num").iter().filter(|&&n| n > 1).count();
            }
        }
        // Drafts were accepted (rows were read, not every draft rejected).
        assert!(accepted > 0);
    }
}
