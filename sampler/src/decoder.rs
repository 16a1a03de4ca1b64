//! [`Decoder`]: the unified decoding step over a batch of request slots.

use std::sync::Arc;

use specula_backend_api::ops::{
    BatchDims, CandidatesInputs, CandidatesOutputs, CandidatesParams, DecodeState, GatherInputs,
    GatherParams, HostSlotLens, LayoutOutputs, LayoutParams, LogprobsInputs, LogprobsOutputs,
    LogprobsParams, NgramInputs, NgramOutputs, NgramParams, OutputLayout, RowSamplingParams,
    RowShape, SampleInputs, SampleParams, SamplingParamsInputs, SamplingParamsParams, SlotLens,
    SlotSamplingParams, SoftmaxParams, StrategyInputs, UpdateStateInputs, UpdateStateParams,
    VerifyInputs, VerifyOutputs, VerifyParams, VerifySlotState,
};
use specula_backend_api::slots::{SlotKind, slot_kind};
use specula_backend_api::{Buffer, Device, DeviceExt, Strategy};
use tracing::debug_span;

use crate::buffers::{Scratch, SlotBuffers, window, write_at};
use crate::config::{Request, SamplerConfig};
use crate::error::{Result, SamplerError};
use crate::seeds;
use crate::step::{
    DecodeStats, FinishReason, OutputRow, Scores, SlotOutput, SlotPlan, SlotStepKind, StepOutput,
    StepPlan, StepScores, TokenLogprob,
};

/// The host's view of an occupied slot.
#[derive(Clone, Debug)]
struct SlotHost {
    request: Request,
    /// Prompt then generated tokens.
    tokens: Vec<i32>,
    /// `seq_lens_encoder`: the prompt length until the prefill step, then 0.
    encoder: usize,
    /// `seq_lens_decoder`: tokens in the KV cache.
    decoder: usize,
    finished: Option<FinishReason>,
}

impl SlotHost {
    fn generated(&self) -> &[i32] {
        &self.tokens[self.request.prompt.len()..]
    }

    fn is_running(&self) -> bool {
        self.finished.is_none()
    }
}

/// Where the decoder is within a step.
#[derive(Debug)]
enum Phase {
    /// Between steps: requests may be inserted and removed.
    Idle,
    /// The scheduler and the proposer have run; drafts may still be set.
    Proposed { real_bsz: usize },
    /// The layout and per-row parameters are on the device; waiting for the runner's scores.
    Planned { plan: StepPlan },
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Proposed { .. } => "proposed",
            Phase::Planned { .. } => "planned",
        }
    }
}

/// A request taken out of its slot.
#[derive(Clone, Debug, PartialEq)]
pub struct RemovedRequest {
    /// The request as inserted.
    pub request: Request,
    /// The tokens it generated.
    pub generated: Vec<i32>,
    /// Why it stopped, if it did.
    pub finished: Option<FinishReason>,
}

/// The sampling side of a runner: a batch of request slots on one device and the unified
/// decoding step over them.
///
/// One step, split where the runner's model runs:
///
/// 1. [`propose`](Decoder::propose) (optional, [`plan`](Decoder::plan) calls it): the scheduler
///    feeds a newly inserted request's whole prompt (a prefill) and one token to every running
///    slot, then the n-gram proposer (when configured and `S > 1`) adds drafts. A runner with its
///    own draft model sets drafts with [`set_drafts`](Decoder::set_drafts) instead.
/// 2. [`plan`](Decoder::plan): builds the output layout and the per-row sampling parameters on the
///    device and returns the host-side [`StepPlan`]: the packed input tokens and what each output
///    row predicts.
/// 3. The runner's forward pass over the packed tokens, then
///    [`gather_next_token`](Decoder::gather_next_token) and its LM head: `[R, V]` logits.
/// 4. [`finish`](Decoder::finish): softmax with each request's temperature, the strategy's target
///    (argmax, sample or candidates), `verify_draft_tokens`, optionally `accept_logprobs`, and
///    `update_state`; returns each slot's emitted tokens.
///
/// Non-speculative decoding (`S = 1`, or no drafts) runs exactly the same code with zero drafts,
/// and with GREEDY or TARGET_MATCH emits exactly the same tokens as speculative decoding.
#[derive(Debug)]
pub struct Decoder {
    device: Arc<dyn Device>,
    config: SamplerConfig,
    slots: Vec<Option<SlotHost>>,
    state: SlotBuffers,
    scratch: Scratch,
    phase: Phase,
    step: u64,
    stats: DecodeStats,
    /// Host mirrors for validation and for the plan, `[max_bsz]` (`[max_bsz · S]` for drafts).
    host_this_time: Vec<i32>,
    host_encoder: Vec<i32>,
    host_drafts: Vec<i32>,
    host_top_p: Vec<f32>,
    host_temperature: Vec<f32>,
}

impl Decoder {
    /// Allocates the device state and scratch buffers for `config` on `device`.
    pub fn new(device: Arc<dyn Device>, config: SamplerConfig) -> Result<Self> {
        config.validate()?;
        let state = SlotBuffers::new(device.as_ref(), &config)?;
        let scratch = Scratch::new(device.as_ref(), &config)?;
        let n = config.max_bsz;
        Ok(Decoder {
            host_this_time: vec![0; n],
            host_encoder: vec![0; n],
            host_drafts: vec![-1; n * config.max_step_tokens],
            host_top_p: vec![1.0; n],
            host_temperature: vec![1.0; n],
            slots: vec![None; n],
            device,
            config,
            state,
            scratch,
            phase: Phase::Idle,
            step: 0,
            stats: DecodeStats::default(),
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Totals over the decoder's life.
    pub fn stats(&self) -> DecodeStats {
        self.stats
    }

    /// Steps finished so far (the number of the next step).
    pub fn step_number(&self) -> u64 {
        self.step
    }

    // ----- slots -----

    /// Inserts a request into the lowest free slot and returns the slot. Its first step is a
    /// prefill of the whole prompt.
    pub fn insert(&mut self, request: Request) -> Result<usize> {
        let slot = self
            .slots
            .iter()
            .position(Option::is_none)
            .ok_or(SamplerError::NoFreeSlot {
                max_bsz: self.config.max_bsz,
            })?;
        self.insert_at(slot, request)?;
        Ok(slot)
    }

    /// Inserts a request into a given free slot. Only between steps.
    pub fn insert_at(&mut self, slot: usize, request: Request) -> Result<()> {
        self.require_idle("insert")?;
        self.check_slot(slot)?;
        if self.slots[slot].is_some() {
            return Err(SamplerError::SlotOccupied { slot });
        }
        request.validate(&self.config)?;
        let s = self.config.max_step_tokens;
        let prompt_len = request.prompt.len();
        let as_i32 = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
        let drafts = request.max_draft_tokens.unwrap_or(s - 1).min(s - 1);
        let device = self.device.as_ref();
        let st = &mut self.state;
        write_at(
            device,
            &mut st.token_ids_all,
            slot * self.config.max_model_len,
            &request.prompt,
        )?;
        write_at(device, &mut st.prompt_lens, slot, &[as_i32(prompt_len)])?;
        write_at(device, &mut st.step_idx, slot, &[0i32])?;
        write_at(
            device,
            &mut st.infer_seed,
            slot,
            &[seeds::request_seed(request.seed)],
        )?;
        write_at(device, &mut st.draft_tokens, slot * s, &vec![-1i32; s])?;
        write_at(device, &mut st.seq_lens_this_time, slot, &[0i32])?;
        write_at(
            device,
            &mut st.seq_lens_encoder,
            slot,
            &[as_i32(prompt_len)],
        )?;
        write_at(device, &mut st.seq_lens_decoder, slot, &[0i32])?;
        write_at(device, &mut st.is_block_step, slot, &[0u8])?;
        write_at(device, &mut st.reasoning_status, slot, &[0i32])?;
        write_at(
            device,
            &mut st.max_dec_len,
            slot,
            &[as_i32(request.max_dec_len)],
        )?;
        write_at(device, &mut st.draft_token_num, slot, &[as_i32(drafts)])?;
        write_at(device, &mut st.top_p, slot, &[request.top_p])?;
        write_at(device, &mut st.top_k, slot, &[as_i32(request.top_k)])?;
        write_at(device, &mut st.temperature, slot, &[request.temperature])?;
        // Last: the slot is live from here on.
        write_at(device, &mut st.stop_flags, slot, &[0u8])?;
        self.host_top_p[slot] = request.top_p;
        self.host_temperature[slot] = request.temperature;
        self.slots[slot] = Some(SlotHost {
            tokens: request.prompt.clone(),
            encoder: prompt_len,
            decoder: 0,
            finished: None,
            request,
        });
        Ok(())
    }

    /// Takes the request out of its slot (finished or not) and frees the slot. Only between steps.
    pub fn remove(&mut self, slot: usize) -> Result<RemovedRequest> {
        self.require_idle("remove")?;
        self.check_slot(slot)?;
        let Some(host) = self.slots[slot].take() else {
            return Err(SamplerError::SlotEmpty { slot });
        };
        let device = self.device.as_ref();
        // A stopped slot is never touched by any op; a zero encoder keeps a request removed before
        // its prefill out of the proposer's budget.
        let cleared = write_at(device, &mut self.state.stop_flags, slot, &[1u8])
            .and_then(|()| write_at(device, &mut self.state.seq_lens_encoder, slot, &[0i32]));
        if let Err(error) = cleared {
            self.slots[slot] = Some(host);
            return Err(error);
        }
        self.host_top_p[slot] = 1.0;
        self.host_temperature[slot] = 1.0;
        Ok(RemovedRequest {
            generated: host.generated().to_vec(),
            finished: host.finished,
            request: host.request,
        })
    }

    /// The tokens a slot's request has generated so far (`None` for an empty slot).
    pub fn generated(&self, slot: usize) -> Option<&[i32]> {
        self.slots.get(slot)?.as_ref().map(SlotHost::generated)
    }

    /// Prompt followed by the generated tokens (`None` for an empty slot).
    pub fn context(&self, slot: usize) -> Option<&[i32]> {
        self.slots.get(slot)?.as_ref().map(|h| h.tokens.as_slice())
    }

    /// The request in a slot.
    pub fn request(&self, slot: usize) -> Option<&Request> {
        self.slots.get(slot)?.as_ref().map(|h| &h.request)
    }

    /// Why the slot's request stopped; `None` while it runs (or for an empty slot).
    pub fn finish_reason(&self, slot: usize) -> Option<FinishReason> {
        self.slots.get(slot)?.as_ref()?.finished
    }

    /// Whether the slot holds a request that has not stopped.
    pub fn is_running(&self, slot: usize) -> bool {
        self.slots
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(SlotHost::is_running)
    }

    /// Whether any slot holds a request that has not stopped.
    pub fn has_running(&self) -> bool {
        (0..self.slots.len()).any(|b| self.is_running(b))
    }

    /// The occupied slots, in order.
    pub fn occupied_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&b| self.slots[b].is_some())
            .collect()
    }

    /// Number of free slots.
    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.is_none()).count()
    }

    /// The slot's `infer_seed` as the device holds it: the seed of its next token,
    /// `seeds::infer_seed_after(request_seed, generated)`.
    pub fn infer_seed(&self, slot: usize) -> Result<u64> {
        self.check_slot(slot)?;
        let seeds: Vec<u64> = self.device.download(&self.state.infer_seed)?;
        Ok(seeds[slot])
    }

    // ----- the step -----

    /// Runs the scheduler and the proposer. Called by [`plan`](Decoder::plan) when not called
    /// before; call it yourself to set drafts with [`set_drafts`](Decoder::set_drafts) in between.
    pub fn propose(&mut self) -> Result<()> {
        match self.phase {
            Phase::Idle => {}
            Phase::Proposed { .. } => return Ok(()),
            Phase::Planned { .. } => {
                return Err(SamplerError::Phase {
                    call: "propose",
                    phase: self.phase.name(),
                });
            }
        }
        let s = self.config.max_step_tokens;
        let real_bsz = self
            .slots
            .iter()
            .rposition(|h| h.as_ref().is_some_and(SlotHost::is_running))
            .map_or(0, |b| b + 1);
        let mut decode_slots = 0;
        for b in 0..self.config.max_bsz {
            let (this_time, encoder) = match &self.slots[b] {
                Some(h) if b < real_bsz && h.is_running() => {
                    if h.encoder > 0 {
                        (h.encoder, h.encoder)
                    } else {
                        decode_slots += 1;
                        self.host_drafts[b * s] = h.tokens.last().copied().unwrap_or(-1);
                        (1, 0)
                    }
                }
                Some(h) => (0, h.encoder),
                None => (0, 0),
            };
            self.host_this_time[b] = i32::try_from(this_time).unwrap_or(i32::MAX);
            self.host_encoder[b] = i32::try_from(encoder).unwrap_or(i32::MAX);
        }
        let dims = self.dims(real_bsz);
        let device = self.device.as_ref();
        device.write(&mut self.state.seq_lens_this_time, &self.host_this_time)?;
        if let Some(ngram) = self.config.ngram
            && s > 1
            && decode_slots > 0
        {
            let st = &mut self.state;
            device.ngram_match(
                &NgramInputs {
                    token_ids_all: &st.token_ids_all,
                    prompt_lens: &st.prompt_lens,
                    step_idx: &st.step_idx,
                    draft_token_num: &st.draft_token_num,
                    seq_lens_encoder: &st.seq_lens_encoder,
                    max_dec_len: &st.max_dec_len,
                },
                &mut NgramOutputs {
                    draft_tokens: &mut st.draft_tokens,
                    seq_lens_this_time: &mut st.seq_lens_this_time,
                },
                &NgramParams {
                    dims,
                    max_model_len: self.config.max_model_len,
                    max_ngram_size: ngram.max_ngram_size,
                    min_ngram_size: ngram.min_ngram_size,
                    threshold: ngram.threshold,
                },
            )?;
            self.host_this_time = device.download(&st.seq_lens_this_time)?;
            self.host_drafts = device.download(&st.draft_tokens)?;
        }
        self.phase = Phase::Proposed { real_bsz };
        Ok(())
    }

    /// Sets the drafts of a running decode slot for this step (a runner's own draft model). Call
    /// after [`propose`](Decoder::propose) and before [`plan`](Decoder::plan); at most `S − 1`
    /// tokens, each in `0 .. V`. Replaces any drafts the n-gram proposer made.
    pub fn set_drafts(&mut self, slot: usize, drafts: &[i32]) -> Result<()> {
        if !matches!(self.phase, Phase::Proposed { .. }) {
            return Err(SamplerError::Phase {
                call: "set_drafts",
                phase: self.phase.name(),
            });
        }
        self.check_slot(slot)?;
        let s = self.config.max_step_tokens;
        let bad = |reason: String| Err(SamplerError::Drafts { slot, reason });
        if self.host_this_time[slot] <= 0 || self.host_encoder[slot] > 0 {
            return bad("not a running decode slot this step".into());
        }
        if drafts.len() > s - 1 {
            return bad(format!("{} drafts > S - 1 = {}", drafts.len(), s - 1));
        }
        if let Some(t) = drafts.iter().find(|&&t| !self.config.in_vocab(t)) {
            return bad(format!("token {t} not in 0 .. {}", self.config.vocab));
        }
        let this_time = 1 + drafts.len() as i32;
        let device = self.device.as_ref();
        write_at(device, &mut self.state.draft_tokens, slot * s + 1, drafts)?;
        write_at(
            device,
            &mut self.state.seq_lens_this_time,
            slot,
            &[this_time],
        )?;
        self.host_drafts[slot * s + 1..slot * s + 1 + drafts.len()].copy_from_slice(drafts);
        self.host_this_time[slot] = this_time;
        Ok(())
    }

    /// Builds the output layout and the per-row sampling parameters on the device and returns
    /// what the runner must compute. Runs [`propose`](Decoder::propose) first if needed; calling it
    /// again before [`finish`](Decoder::finish) returns the same plan. An empty plan means there is
    /// no running request: nothing to compute, and no `finish` to call.
    pub fn plan(&mut self) -> Result<StepPlan> {
        if let Phase::Planned { plan } = &self.phase {
            return Ok(plan.clone());
        }
        self.propose()?;
        let Phase::Proposed { real_bsz } = self.phase else {
            return Err(SamplerError::Phase {
                call: "plan",
                phase: self.phase.name(),
            });
        };
        let plan = self.host_plan(real_bsz);
        let _span = debug_span!(
            "decode_step",
            step = self.step,
            real_bsz,
            t_out = plan.t_out(),
            drafts = plan.drafts()
        )
        .entered();
        if plan.is_empty() {
            self.phase = Phase::Idle;
            return Ok(plan);
        }
        let dims = self.dims(real_bsz);
        let device = self.device.as_ref();
        let sc = &mut self.scratch;
        let st = &self.state;
        window(&mut sc.cu_seqlens_q, real_bsz + 1)?;
        window(&mut sc.cu_seqlens_q_output, real_bsz + 1)?;
        window(&mut sc.batch_id_per_token_output, plan.gather_rows)?;
        sc.window_rows(plan.gather_rows, self.config.vocab, self.config.candidates)?;
        let host = HostSlotLens {
            seq_lens_this_time: &self.host_this_time,
            seq_lens_encoder: &self.host_encoder,
        };
        let lens = SlotLens {
            seq_lens_this_time: &st.seq_lens_this_time,
            seq_lens_encoder: &st.seq_lens_encoder,
        };
        device.build_output_layout(
            &lens,
            &mut LayoutOutputs {
                seq_lens_output: &mut sc.seq_lens_output,
                cu_seqlens_q: &mut sc.cu_seqlens_q,
                cu_seqlens_q_output: &mut sc.cu_seqlens_q_output,
                batch_id_per_token_output: &mut sc.batch_id_per_token_output,
            },
            &LayoutParams {
                dims,
                host: Some(host),
            },
        )?;
        device.build_sampling_params(
            &SamplingParamsInputs {
                slots: SlotSamplingParams {
                    top_p: &st.top_p,
                    top_k: &st.top_k,
                    temperature: &st.temperature,
                    infer_seed: &st.infer_seed,
                },
                lens,
                layout: OutputLayout {
                    cu_seqlens_q_output: &sc.cu_seqlens_q_output,
                    batch_id_per_token_output: &sc.batch_id_per_token_output,
                },
            },
            &mut RowSamplingParams {
                top_p: &mut sc.row_top_p,
                top_k: &mut sc.row_top_k,
                temperature: &mut sc.row_temperature,
                seed: &mut sc.row_seed,
            },
            &SamplingParamsParams {
                dims,
                host: Some(host),
                host_top_p: Some(&self.host_top_p),
                host_temperature: Some(&self.host_temperature),
            },
        )?;
        self.phase = Phase::Planned { plan: plan.clone() };
        Ok(plan)
    }

    /// Gathers the hidden state each output row predicts from (contract §4.1): `hidden_states` is
    /// `[token_num, hidden]` in the packed order of the plan (any dtype), `out` is
    /// `[gather_rows, hidden]` of the same dtype; rows `≥ T_out` are zeros. Bit-exact copy.
    pub fn gather_next_token(
        &self,
        hidden_states: &Buffer,
        hidden: usize,
        out: &mut Buffer,
    ) -> Result<()> {
        let plan = self.current_plan("gather_next_token")?;
        let host = HostSlotLens {
            seq_lens_this_time: &self.host_this_time,
            seq_lens_encoder: &self.host_encoder,
        };
        let st = &self.state;
        let sc = &self.scratch;
        self.device.gather_next_token(
            &GatherInputs {
                hidden_states,
                cu_seqlens_q: &sc.cu_seqlens_q,
                lens: SlotLens {
                    seq_lens_this_time: &st.seq_lens_this_time,
                    seq_lens_encoder: &st.seq_lens_encoder,
                },
                layout: OutputLayout {
                    cu_seqlens_q_output: &sc.cu_seqlens_q_output,
                    batch_id_per_token_output: &sc.batch_id_per_token_output,
                },
            },
            out,
            &GatherParams {
                dims: self.dims(plan.real_bsz),
                token_num: plan.token_num(),
                hidden,
                is_speculative: true,
                host: Some(host),
            },
        )?;
        Ok(())
    }

    /// The tokens up to and including packed input token `input_index` of the current plan: the
    /// sequence whose next token that position predicts. For runners without a KV cache (and toy
    /// models whose probabilities are a function of the prefix).
    pub fn input_prefix(&self, input_index: usize) -> Result<Vec<i32>> {
        let plan = self.current_plan("input_prefix")?;
        let slot_plan = plan
            .slots
            .iter()
            .find(|p| p.inputs.contains(&input_index))
            .ok_or_else(|| SamplerError::ScoresShape {
                reason: format!(
                    "input index {input_index} out of range (token_num {})",
                    plan.token_num()
                ),
            })?;
        let context = self
            .context(slot_plan.slot)
            .ok_or(SamplerError::SlotEmpty {
                slot: slot_plan.slot,
            })?;
        let mut prefix = context[..slot_plan.start_position].to_vec();
        prefix.extend_from_slice(&plan.input_tokens[slot_plan.inputs.start..=input_index]);
        Ok(prefix)
    }

    /// The tokens output row `row` of the current plan predicts from (see
    /// [`input_prefix`](Decoder::input_prefix)).
    pub fn row_prefix(&self, row: usize) -> Result<Vec<i32>> {
        let plan = self.current_plan("row_prefix")?;
        let output = plan
            .output_rows
            .get(row)
            .ok_or_else(|| SamplerError::ScoresShape {
                reason: format!("row {row} out of range (T_out {})", plan.t_out()),
            })?;
        self.input_prefix(output.input_index)
    }

    /// Finishes the step with the runner's scores: softmax (for logits), the strategy's target,
    /// verification, optional log-probabilities and the state update. Returns what each slot
    /// emitted.
    ///
    /// An error caught before the device state is updated (a wrong shape, a missing input, an op's
    /// validation) leaves the step planned, so `finish` can be called again with the right
    /// arguments. An error after that (a failed download) ends the step; the decoder's host mirrors
    /// may then disagree with the device and it should be discarded.
    pub fn finish(&mut self, scores: StepScores<'_>) -> Result<StepOutput> {
        if !matches!(self.phase, Phase::Planned { .. }) {
            return Err(SamplerError::Phase {
                call: "finish",
                phase: self.phase.name(),
            });
        }
        let Phase::Planned { plan } = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return Ok(StepOutput::default());
        };
        let mut committed = false;
        match self.run_finish(&plan, scores, &mut committed) {
            Ok(output) => Ok(output),
            Err(error) => {
                if !committed {
                    self.phase = Phase::Planned { plan };
                }
                Err(error)
            }
        }
    }

    /// A whole step: [`plan`](Decoder::plan), then `forward` (the runner's model, which returns
    /// `[R, V]` logits for the plan), then [`finish`](Decoder::finish). Returns `None` when there
    /// was nothing to run.
    pub fn step<F>(&mut self, forward: F) -> Result<Option<StepOutput>>
    where
        F: FnOnce(&Decoder, &StepPlan) -> Result<Buffer>,
    {
        let plan = self.plan()?;
        if plan.is_empty() {
            return Ok(None);
        }
        let logits = forward(self, &plan)?;
        self.finish(StepScores::logits(&logits)).map(Some)
    }

    // ----- internals -----

    fn dims(&self, real_bsz: usize) -> BatchDims {
        BatchDims {
            max_bsz: self.config.max_bsz,
            real_bsz,
            max_step_tokens: self.config.max_step_tokens,
        }
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.config.max_bsz {
            return Err(SamplerError::SlotOutOfRange {
                slot,
                max_bsz: self.config.max_bsz,
            });
        }
        Ok(())
    }

    fn require_idle(&self, call: &'static str) -> Result<()> {
        match self.phase {
            Phase::Idle => Ok(()),
            _ => Err(SamplerError::Phase {
                call,
                phase: self.phase.name(),
            }),
        }
    }

    fn current_plan(&self, call: &'static str) -> Result<&StepPlan> {
        match &self.phase {
            Phase::Planned { plan } => Ok(plan),
            other => Err(SamplerError::Phase {
                call,
                phase: other.name(),
            }),
        }
    }

    /// The plan from the host mirrors of the slot lengths (after the proposer).
    fn host_plan(&self, real_bsz: usize) -> StepPlan {
        let s = self.config.max_step_tokens;
        let mut plan = StepPlan {
            step: self.step,
            real_bsz,
            gather_rows: real_bsz * s,
            ..StepPlan::default()
        };
        for b in 0..real_bsz {
            let (this_time, encoder) = (self.host_this_time[b], self.host_encoder[b]);
            let kind = slot_kind(this_time, encoder);
            let Some(host) = &self.slots[b] else { continue };
            let (kind, tokens, start_position, rows): (_, &[i32], _, _) = match kind {
                SlotKind::Empty => continue,
                SlotKind::Prefill => (
                    SlotStepKind::Prefill,
                    &host.tokens[..host.encoder],
                    host.decoder,
                    1,
                ),
                SlotKind::Decode => {
                    let n = (this_time as usize).min(s);
                    (
                        SlotStepKind::Decode,
                        &self.host_drafts[b * s..b * s + n],
                        host.decoder,
                        n,
                    )
                }
            };
            let first_input = plan.input_tokens.len();
            let first_row = plan.output_rows.len();
            plan.input_tokens.extend_from_slice(tokens);
            plan.input_positions
                .extend((0..tokens.len()).map(|i| start_position + i));
            let last_input = plan.input_tokens.len() - 1;
            for i in 0..rows {
                let input_index = if kind == SlotStepKind::Prefill {
                    last_input
                } else {
                    first_input + i
                };
                plan.output_rows.push(OutputRow {
                    slot: b,
                    input_index,
                    position: plan.input_positions[input_index],
                });
            }
            plan.slots.push(SlotPlan {
                slot: b,
                kind,
                inputs: first_input..plan.input_tokens.len(),
                start_position,
                drafts: if kind == SlotStepKind::Decode {
                    rows - 1
                } else {
                    0
                },
                rows: first_row..plan.output_rows.len(),
            });
        }
        plan
    }

    /// Per-row temperatures on the host (for the ops' validation): each output row's request,
    /// 1.0 for padding rows.
    fn row_temperatures(&self, plan: &StepPlan, rows: usize) -> Vec<f32> {
        (0..rows)
            .map(|t| {
                plan.output_rows
                    .get(t)
                    .map_or(1.0, |r| self.host_temperature[r.slot])
            })
            .collect()
    }

    fn run_finish(
        &mut self,
        plan: &StepPlan,
        scores: StepScores<'_>,
        committed: &mut bool,
    ) -> Result<StepOutput> {
        let _span = debug_span!(
            "decode_step",
            step = self.step,
            real_bsz = plan.real_bsz,
            t_out = plan.t_out()
        )
        .entered();
        let vocab = self.config.vocab;
        let s = self.config.max_step_tokens;
        let t_out = plan.t_out();
        let (target, is_logits) = match scores.target {
            Scores::Logits(b) => (b, true),
            Scores::Probs(b) => (b, false),
        };
        if target.len() % vocab != 0 {
            return Err(SamplerError::ScoresShape {
                reason: format!(
                    "{} elements is not a whole number of rows of V = {vocab}",
                    target.len()
                ),
            });
        }
        let rows = target.len() / vocab;
        if rows < t_out || rows > plan.gather_rows {
            return Err(SamplerError::ScoresShape {
                reason: format!(
                    "{rows} rows, expected T_out = {t_out} ..= gather_rows = {}",
                    plan.gather_rows
                ),
            });
        }
        if self.config.logprobs.is_some() && !is_logits {
            return Err(SamplerError::LogprobsNeedLogits);
        }
        let rejection = self.config.strategy == Strategy::Rejection && plan.drafts() > 0;
        if rejection {
            if scores.draft_probs.is_none() {
                return Err(SamplerError::MissingDraftProbs);
            }
            if !is_logits && rows != t_out {
                return Err(SamplerError::ScoresShape {
                    reason: format!(
                        "rejection needs exactly T_out = {t_out} probability rows, got {rows}"
                    ),
                });
            }
        }
        let dims = self.dims(plan.real_bsz);
        let shape = RowShape { rows, vocab };
        let row_temperature = self.row_temperatures(plan, rows);
        let device = self.device.as_ref();

        // 1. Probabilities.
        if is_logits && self.scratch.probs.is_none() {
            let capacity = self.config.max_bsz * s * vocab;
            self.scratch.probs = Some(device.alloc::<f32>(capacity)?);
        }
        self.scratch
            .window_rows(rows, vocab, self.config.candidates)?;
        let sc = &mut self.scratch;
        let probs: &Buffer = if is_logits {
            let Some(probs) = sc.probs.as_mut() else {
                return Err(SamplerError::ScoresShape {
                    reason: "no probability buffer".into(),
                });
            };
            device.softmax(
                target,
                &sc.row_temperature,
                probs,
                &SoftmaxParams {
                    shape,
                    host_temperature: Some(&row_temperature),
                },
            )?;
            probs
        } else {
            target
        };

        // 2. The strategy's target for every row.
        let strategy = if self.config.strategy == Strategy::Rejection && !rejection {
            // No drafts to test: REJECTION's phase 2 is exactly a TARGET_MATCH sample.
            Strategy::TargetMatch
        } else {
            self.config.strategy
        };
        match strategy {
            Strategy::Greedy => device.argmax(probs, &mut sc.target_tokens, &shape)?,
            Strategy::TargetMatch => device.top_k_top_p_sample(
                &SampleInputs {
                    probs,
                    top_k: &sc.row_top_k,
                    top_p: &sc.row_top_p,
                    seed: &sc.row_seed,
                },
                &mut sc.target_tokens,
                &SampleParams {
                    shape,
                    host_top_p: None,
                },
            )?,
            Strategy::TopP => {
                let Some(c) = sc.candidates.as_mut() else {
                    return Err(SamplerError::Config {
                        field: "strategy",
                        reason: "topp candidate buffers missing".into(),
                    });
                };
                window(&mut sc.batch_id_per_token_output, rows)?;
                let done = device.top_p_candidates(
                    &CandidatesInputs {
                        probs,
                        top_p: &sc.row_top_p,
                        batch_id_per_token_output: Some(&sc.batch_id_per_token_output),
                    },
                    &mut CandidatesOutputs {
                        ids: &mut c.ids,
                        scores: &mut c.scores,
                        lens: &mut c.lens,
                    },
                    &CandidatesParams {
                        shape,
                        candidates: self.config.candidates,
                        host_top_p: None,
                    },
                );
                window(&mut sc.batch_id_per_token_output, plan.gather_rows)?;
                done?;
            }
            Strategy::Rejection => {}
        }

        // 3. Verify against the first T_out rows.
        window(&mut sc.row_seed, t_out)?;
        window(&mut sc.row_top_k, t_out)?;
        window(&mut sc.row_top_p, t_out)?;
        window(&mut sc.target_tokens, t_out)?;
        if let Some(c) = sc.candidates.as_mut() {
            window(&mut c.ids, t_out * self.config.candidates)?;
            window(&mut c.scores, t_out * self.config.candidates)?;
            window(&mut c.lens, t_out)?;
        }
        if is_logits
            && rejection
            && let Some(p) = sc.probs.as_mut()
        {
            window(p, t_out * vocab)?;
        }
        let target_probs: &Buffer = match (is_logits, &sc.probs) {
            (true, Some(p)) => p,
            _ => target,
        };
        let strategy_inputs = match strategy {
            Strategy::Greedy => StrategyInputs::Greedy {
                target_tokens: &sc.target_tokens,
            },
            Strategy::TargetMatch => StrategyInputs::TargetMatch {
                target_tokens: &sc.target_tokens,
            },
            Strategy::TopP => match &sc.candidates {
                Some(c) => StrategyInputs::TopP {
                    candidate_ids: &c.ids,
                    candidate_scores: &c.scores,
                    candidate_lens: &c.lens,
                    candidates: self.config.candidates,
                },
                None => {
                    return Err(SamplerError::Config {
                        field: "strategy",
                        reason: "topp candidate buffers missing".into(),
                    });
                }
            },
            Strategy::Rejection => StrategyInputs::Rejection {
                target_probs,
                draft_probs: scores.draft_probs.ok_or(SamplerError::MissingDraftProbs)?,
                top_k: &sc.row_top_k,
                top_p: &sc.row_top_p,
            },
        };
        let host = HostSlotLens {
            seq_lens_this_time: &self.host_this_time,
            seq_lens_encoder: &self.host_encoder,
        };
        let st = &mut self.state;
        let lens = SlotLens {
            seq_lens_this_time: &st.seq_lens_this_time,
            seq_lens_encoder: &st.seq_lens_encoder,
        };
        device.verify_draft_tokens(
            &VerifyInputs {
                draft_tokens: &st.draft_tokens,
                lens,
                cu_seqlens_q_output: &sc.cu_seqlens_q_output,
                state: VerifySlotState {
                    stop_flags: &st.stop_flags,
                    is_block_step: &st.is_block_step,
                    reasoning_status: &st.reasoning_status,
                    step_idx: &st.step_idx,
                    max_dec_len: &st.max_dec_len,
                    end_tokens: &st.end_tokens,
                },
                seeds: &sc.row_seed,
                strategy: strategy_inputs,
            },
            &mut VerifyOutputs {
                accept_tokens: &mut sc.accept_tokens,
                accept_num: &mut sc.accept_num,
            },
            &VerifyParams {
                dims,
                rows: t_out,
                vocab,
                accept_all: self.config.accept_all,
                reject_all: self.config.reject_all,
                host: Some(host),
            },
        )?;

        // 4. Log-probabilities, before update_state turns prefill slots into decode slots.
        if let Some(lp) = sc.logprobs.as_mut() {
            device.accept_logprobs(
                &LogprobsInputs {
                    logits: target,
                    temperature: &sc.row_temperature,
                    accept_tokens: &sc.accept_tokens,
                    accept_num: &sc.accept_num,
                    seq_lens_encoder: &st.seq_lens_encoder,
                    cu_seqlens_q_output: &sc.cu_seqlens_q_output,
                },
                &mut LogprobsOutputs {
                    cu_accept: &mut lp.cu_accept,
                    token_ids: &mut lp.token_ids,
                    logprobs: &mut lp.logprobs,
                    ranks: &mut lp.ranks,
                    top_ids: &mut lp.top_ids,
                    top_logprobs: &mut lp.top_logprobs,
                },
                &LogprobsParams {
                    dims,
                    shape,
                    top_k: lp.top_k,
                    host_temperature: Some(&row_temperature),
                },
            )?;
        }

        // 5. Commit on the device.
        *committed = true;
        device.update_state(
            &UpdateStateInputs {
                accept_tokens: &sc.accept_tokens,
                is_block_step: &st.is_block_step,
                prompt_lens: &st.prompt_lens,
                max_dec_len: &st.max_dec_len,
                end_tokens: &st.end_tokens,
            },
            &mut DecodeState {
                accept_num: &mut sc.accept_num,
                stop_flags: &mut st.stop_flags,
                token_ids_all: &mut st.token_ids_all,
                step_idx: &mut st.step_idx,
                infer_seed: &mut st.infer_seed,
                draft_tokens: &mut st.draft_tokens,
                seq_lens_encoder: &mut st.seq_lens_encoder,
                seq_lens_decoder: &mut st.seq_lens_decoder,
            },
            &UpdateStateParams {
                dims,
                max_model_len: self.config.max_model_len,
            },
        )?;
        let accept_tokens: Vec<i32> = device.download(&sc.accept_tokens)?;
        let accept_num: Vec<i32> = device.download(&sc.accept_num)?;
        let stop_flags: Vec<u8> = device.download(&st.stop_flags)?;
        let logprobs = match &sc.logprobs {
            Some(lp) => Some(DownloadedLogprobs {
                top_k: lp.top_k,
                cu_accept: device.download(&lp.cu_accept)?,
                logprobs: device.download(&lp.logprobs)?,
                ranks: device.download(&lp.ranks)?,
                top_ids: device.download(&lp.top_ids)?,
                top_logprobs: device.download(&lp.top_logprobs)?,
            }),
            None => None,
        };

        // 6. Commit on the host.
        let mut output = StepOutput {
            step: self.step,
            slots: Vec::with_capacity(plan.slots.len()),
        };
        for slot_plan in &plan.slots {
            let b = slot_plan.slot;
            let n = usize::try_from(accept_num[b]).unwrap_or(0).min(s);
            let tokens = accept_tokens[b * s..b * s + n].to_vec();
            let drafts = &self.host_drafts[b * s + 1..b * s + 1 + slot_plan.drafts];
            let drafts_accepted = tokens
                .iter()
                .zip(drafts)
                .take_while(|(t, d)| t == d)
                .count();
            let token_logprobs = logprobs.as_ref().map(|lp| lp.for_slot(b, &tokens));
            let Some(host) = self.slots[b].as_mut() else {
                continue;
            };
            host.tokens.extend_from_slice(&tokens);
            if n > 0 {
                if host.encoder > 0 {
                    host.decoder += host.encoder;
                    host.encoder = 0;
                } else {
                    host.decoder += n;
                }
            }
            if stop_flags[b] != 0 && host.finished.is_none() {
                host.finished = Some(finish_reason(host, &self.config));
            }
            self.stats.tokens_emitted += n as u64;
            self.stats.drafts_proposed += slot_plan.drafts as u64;
            self.stats.drafts_accepted += drafts_accepted as u64;
            output.slots.push(SlotOutput {
                slot: b,
                tokens,
                drafts_proposed: slot_plan.drafts,
                drafts_accepted,
                finished: host.finished,
                logprobs: token_logprobs,
            });
        }
        self.stats.steps += 1;
        self.step += 1;
        Ok(output)
    }
}

/// Why a slot that `update_state` stopped has stopped. A token that both is an end token and
/// reaches `max_dec_len` counts as `MaxDecLen` (the two cannot be told apart: that token is
/// replaced by `end_tokens[0]`).
fn finish_reason(host: &SlotHost, config: &SamplerConfig) -> FinishReason {
    let generated = host.generated();
    if generated.len() >= host.request.max_dec_len {
        FinishReason::MaxDecLen
    } else if generated
        .last()
        .is_some_and(|t| config.end_tokens.contains(t))
    {
        FinishReason::EndToken
    } else {
        FinishReason::MaxModelLen
    }
}

/// The outputs of `accept_logprobs`, on the host.
struct DownloadedLogprobs {
    top_k: usize,
    cu_accept: Vec<i32>,
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    top_ids: Vec<i32>,
    top_logprobs: Vec<f32>,
}

impl DownloadedLogprobs {
    fn for_slot(&self, slot: usize, tokens: &[i32]) -> Vec<TokenLogprob> {
        let start = self
            .cu_accept
            .get(slot)
            .and_then(|&c| usize::try_from(c).ok())
            .unwrap_or(0);
        tokens
            .iter()
            .enumerate()
            .map(|(k, &token)| {
                let p = start + k;
                let top = (0..self.top_k)
                    .filter_map(|j| {
                        let id = *self.top_ids.get(p * self.top_k + j)?;
                        let lp = *self.top_logprobs.get(p * self.top_k + j)?;
                        Some((id, lp))
                    })
                    .collect();
                TokenLogprob {
                    token,
                    logprob: self.logprobs.get(p).copied().unwrap_or(f32::NEG_INFINITY),
                    rank: self.ranks.get(p).copied().unwrap_or(0),
                    top,
                }
            })
            .collect()
    }
}
