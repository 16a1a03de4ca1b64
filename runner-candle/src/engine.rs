//! The step loop of `docs/runner.md`, for real: continuous batching of requests over one model,
//! each request with its own KV cache, plain or speculative decoding by a Specula [`Decoder`].
//!
//! Each step:
//!
//! 1. the requests waiting are inserted while slots are free;
//! 2. [`Decoder::propose`] runs the n-gram proposer (when speculative), or a runner's own
//!    [`Drafter`] sets each request's drafts ([`Decoder::set_drafts`]; the configuration of
//!    [`SamplerConfig::with_runner_drafts`]); with the adaptive [`DraftPolicy`] each request
//!    keeps only as many of its drafts as its own [`DraftLength`] allows; [`Decoder::plan`] says
//!    what to feed: for a new request its prompt, for a running one its last token and its
//!    drafts;
//! 3. the forward pass, **one call per request**: its KV cache is cut back to
//!    [`SlotPlan::start_position`](specula_sampler::SlotPlan::start_position) (dropping the
//!    positions of last step's rejected drafts), its step tokens are fed in one call, and the
//!    logits of its output rows come back — the last token's and one per draft;
//! 4. the step's `[T_out, V]` logits are handed to [`Decoder::finish`] with `borrow_host` (no copy
//!    on the CPU device; an upload on the others), which samples them exactly (no softmax),
//!    verifies the drafts and returns what each request emitted;
//! 5. each finished request is removed, its slot free for the next.
//!
//! With a batch-invariant forward pass ([`crate::model`]) the logits of a draft position equal
//! those plain decoding computes for it, so with TARGET_MATCH the speculative run emits exactly
//! the plain run's tokens, on every Specula backend.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specula_backend_api::{DType, Device, DeviceExt};
use specula_sampler::{
    Decoder, FinishReason, Request, SamplerConfig, SlotPlan, SlotStepKind, StepOutput, StepPlan,
    StepScores,
};

use crate::draft_length::{DraftLength, DraftPolicy};
use crate::error::{Result, RunnerError};
use crate::kv_cache::KvCache;
use crate::model::Llama;

/// A request's tokens of one step, as the engine reports them.
#[derive(Debug)]
pub struct TokenEvent<'a> {
    /// The request (its index in the list given to [`Engine::run`]).
    pub request: usize,
    /// The tokens it emitted this step (possibly its stop token last).
    pub tokens: &'a [i32],
    /// Why it stopped, when this step ended it.
    pub finished: Option<FinishReason>,
}

/// A runner's own source of drafts (a draft model, a retrieval index, a replay), asked each step
/// for the drafts of every decoding request, in place of the n-gram proposer. The engine hands
/// them to [`Decoder::set_drafts`], so the decoder's configuration must leave room for them
/// ([`SamplerConfig::with_runner_drafts`]). With TARGET_MATCH or GREEDY the emitted tokens do not
/// depend on the drafts — only the number of steps does.
pub trait Drafter {
    /// The drafts of request `request` (its index in the list given to [`Engine::run`]), which
    /// has generated `generated` so far: at most `max` tokens (more are cut), each in
    /// `0 .. vocab`.
    fn drafts(&mut self, request: usize, generated: &[i32], max: usize) -> Vec<i32>;
}

/// Where the time of a run went, and what speculation achieved.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Decoding steps.
    pub steps: u64,
    /// Tokens emitted, over all requests.
    pub tokens: u64,
    /// Prompt tokens fed (prefills).
    pub prompt_tokens: u64,
    /// Drafts fed to the model (the n-gram proposer's, cut to each request's draft length).
    pub drafts_proposed: u64,
    /// Drafts accepted.
    pub drafts_accepted: u64,
    /// Time in the model: the forward passes, the LM head, the logits to the host.
    pub forward: Duration,
    /// The part of `forward` spent on prompts (prefill slots), each of which also yields its
    /// request's first token.
    pub prefill: Duration,
    /// Requests whose prompt was fed (one first token each).
    pub prefills: u64,
    /// Time in Specula: insert/remove, propose and plan, `borrow_host` and `finish`.
    pub specula: Duration,
    /// Wall time of the whole run (the two above and the engine's own bookkeeping).
    pub total: Duration,
}

impl RunStats {
    /// Accepted drafts over proposed drafts (0 when none was proposed).
    pub fn acceptance_rate(&self) -> f64 {
        match self.drafts_proposed {
            0 => 0.0,
            n => self.drafts_accepted as f64 / n as f64,
        }
    }

    /// Emitted tokens per second of the run.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.total.as_secs_f64().max(1e-9)
    }

    /// Tokens/s of decoding alone: the tokens after each request's first over the run's time
    /// without the prompts' forward passes (llama.cpp's "eval" rate, where `tokens_per_second`
    /// also counts the prompt pass).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let tokens = self.tokens.saturating_sub(self.prefills) as f64;
        tokens
            / self
                .total
                .saturating_sub(self.prefill)
                .as_secs_f64()
                .max(1e-9)
    }

    /// Share of the run spent in the forward pass.
    pub fn forward_share(&self) -> f64 {
        self.forward.as_secs_f64() / self.total.as_secs_f64().max(1e-9)
    }

    /// Share of the run spent in Specula.
    pub fn specula_share(&self) -> f64 {
        self.specula.as_secs_f64() / self.total.as_secs_f64().max(1e-9)
    }

    /// Prompt tokens per second of the prompts' forward passes (llama.cpp's "prompt eval" rate).
    pub fn prompt_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    /// The summary `specula-generate` prints, one line each as llama.cpp splits its timings:
    /// the prompt pass, decoding (the tokens after each prompt's first), the whole run.
    pub fn summary_lines(&self) -> [String; 3] {
        [
            format!(
                "prompt: {} tokens in {:.2} s ({:.1} tokens/s)",
                self.prompt_tokens,
                self.prefill.as_secs_f64(),
                self.prompt_tokens_per_second(),
            ),
            format!(
                "decoding: {} tokens in {:.2} s ({:.1} tokens/s), {} steps, drafts accepted \
                 {:.1}% ({} of {})",
                self.tokens.saturating_sub(self.prefills),
                self.total.saturating_sub(self.prefill).as_secs_f64(),
                self.decode_tokens_per_second(),
                self.steps,
                100.0 * self.acceptance_rate(),
                self.drafts_accepted,
                self.drafts_proposed,
            ),
            format!(
                "total: {} tokens in {:.2} s ({:.1} tokens/s), forward {:.1}% of the run, \
                 Specula {:.2}%",
                self.tokens,
                self.total.as_secs_f64(),
                self.tokens_per_second(),
                100.0 * self.forward_share(),
                100.0 * self.specula_share(),
            ),
        ]
    }

    /// [`summary_lines`](RunStats::summary_lines) on one line, `; `-separated.
    pub fn summary(&self) -> String {
        self.summary_lines().join("; ")
    }
}

/// What a run produced: per request (in the order given) its tokens and why it stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutput {
    /// The tokens each request generated (its stop token included, when it has one).
    pub generated: Vec<Vec<i32>>,
    /// Why each request stopped.
    pub finished: Vec<FinishReason>,
    /// Time and speculation figures.
    pub stats: RunStats,
}

/// What computes the logits of one request's step: the model's forward pass.
///
/// [`KvForward`] is the runner's (a KV cache per slot, cut back to the plan's start position).
/// The seam lets a test replay logits it has already computed for the same token prefix — which
/// batch invariance makes exactly what the model would compute again.
pub trait Forward {
    /// Vocabulary size of the logits rows.
    fn vocab(&self) -> usize;

    /// Appends to `logits` the rows of `slot`'s output rows (`plan.output_rows[slot.rows]`, in
    /// order), `V` floats each, computed by feeding `plan.input_tokens[slot.inputs]` at positions
    /// `slot.start_position ..` after the request's earlier tokens. `decoder` is planned: its
    /// `row_prefix` gives each row's whole token prefix.
    fn forward(
        &mut self,
        decoder: &Decoder,
        plan: &StepPlan,
        slot: &SlotPlan,
        logits: &mut Vec<f32>,
    ) -> Result<()>;
}

impl<F: Forward + ?Sized> Forward for &mut F {
    fn vocab(&self) -> usize {
        (**self).vocab()
    }

    fn forward(
        &mut self,
        decoder: &Decoder,
        plan: &StepPlan,
        slot: &SlotPlan,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        (**self).forward(decoder, plan, slot, logits)
    }
}

/// The runner's forward pass: the model, and a KV cache per slot.
#[derive(Debug)]
pub struct KvForward<'m> {
    model: &'m Llama,
    caches: Vec<KvCache>,
}

impl<'m> KvForward<'m> {
    /// `slots` empty caches over `model`.
    pub fn new(model: &'m Llama, slots: usize) -> Self {
        KvForward {
            model,
            caches: (0..slots).map(|_| model.new_cache()).collect(),
        }
    }
}

impl Forward for KvForward<'_> {
    fn vocab(&self) -> usize {
        self.model.config().vocab
    }

    /// Cuts the slot's KV cache back to `slot.start_position` (dropping the positions of last
    /// step's rejected drafts, or a finished request's whole sequence when the slot is reused)
    /// and feeds the slot's step tokens in one call.
    fn forward(
        &mut self,
        _decoder: &Decoder,
        plan: &StepPlan,
        slot: &SlotPlan,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let cache = self
            .caches
            .get_mut(slot.slot)
            .ok_or_else(|| RunnerError::Internal(format!("slot {} has no KV cache", slot.slot)))?;
        cache.truncate(slot.start_position);
        if cache.len() != slot.start_position {
            return Err(RunnerError::Internal(format!(
                "slot {} starts at position {} with {} positions cached",
                slot.slot,
                slot.start_position,
                cache.len()
            )));
        }
        let tokens = step_tokens(plan, slot);
        let rows = step_rows(plan, slot);
        logits.extend(self.model.forward(&tokens, cache, &rows)?);
        Ok(())
    }
}

/// A slot's step tokens as the model takes them.
pub fn step_tokens(plan: &StepPlan, slot: &SlotPlan) -> Vec<u32> {
    plan.input_tokens[slot.inputs.clone()]
        .iter()
        .map(|&t| t as u32)
        .collect()
}

/// A slot's output rows as indices into its step tokens.
pub fn step_rows(plan: &StepPlan, slot: &SlotPlan) -> Vec<usize> {
    plan.output_rows[slot.rows.clone()]
        .iter()
        .map(|row| row.input_index - slot.inputs.start)
        .collect()
}

/// A Specula decoder and the forward pass it samples.
pub struct Engine<F> {
    forward: F,
    device: Arc<dyn Device>,
    decoder: Decoder,
    policy: DraftPolicy,
    /// Each slot's draft length (reset when a request is inserted).
    draft_lengths: Vec<DraftLength>,
    /// The runner's own drafts, if any (else the n-gram proposer's, if configured).
    drafter: Option<Box<dyn Drafter>>,
    /// The request each slot holds during [`Engine::run`] (by index).
    in_slot: Vec<Option<usize>>,
}

impl<F> std::fmt::Debug for Engine<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.device.info().name)
            .field("config", self.decoder.config())
            .field("policy", &self.policy)
            .field("drafter", &self.drafter.is_some())
            .finish()
    }
}

impl<'m> Engine<KvForward<'m>> {
    /// A decoder of `config` on `device` over `model`, with a KV cache per slot.
    /// `config.max_model_len` must be at most the model's context.
    pub fn new(model: &'m Llama, device: Arc<dyn Device>, config: SamplerConfig) -> Result<Self> {
        if config.max_model_len > model.max_positions() {
            return Err(RunnerError::argument(
                "max_model_len",
                format!(
                    "{} exceeds the model's context {}",
                    config.max_model_len,
                    model.max_positions()
                ),
            ));
        }
        let forward = KvForward::new(model, config.max_bsz);
        Engine::with_forward(forward, device, config)
    }
}

impl<F: Forward> Engine<F> {
    /// A decoder of `config` on `device` sampling the logits of `forward`; `config.vocab` must be
    /// the forward's. Builds the decoder's kernels for f32 logits now (`Decoder::warm_up_for`),
    /// so the first step does not pay for them.
    pub fn with_forward(
        forward: F,
        device: Arc<dyn Device>,
        config: SamplerConfig,
    ) -> Result<Self> {
        if config.vocab != forward.vocab() {
            return Err(RunnerError::argument(
                "vocab",
                format!("{} is not the model's {}", config.vocab, forward.vocab()),
            ));
        }
        let max_drafts = config.max_step_tokens.saturating_sub(1);
        let draft_lengths = vec![DraftLength::new(max_drafts); config.max_bsz];
        let decoder = Decoder::new(device.clone(), config)?;
        decoder.warm_up_for(DType::F32)?;
        Ok(Engine {
            forward,
            device,
            decoder,
            policy: DraftPolicy::default(),
            draft_lengths,
            drafter: None,
            in_slot: Vec::new(),
        })
    }

    /// The engine with the runner's own drafts from `drafter` (see [`Drafter`]); the decoder's
    /// configuration must take runner drafts ([`SamplerConfig::with_runner_drafts`]).
    pub fn with_drafter(mut self, drafter: impl Drafter + 'static) -> Self {
        self.drafter = Some(Box::new(drafter));
        self
    }

    /// The engine with `policy` for the drafts each request feeds (adaptive by default).
    pub fn with_draft_policy(mut self, policy: DraftPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How the drafts each request feeds are chosen.
    pub fn draft_policy(&self) -> DraftPolicy {
        self.policy
    }

    /// The forward pass.
    pub fn forward_pass(&self) -> &F {
        &self.forward
    }

    /// The Specula device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The decoder's configuration.
    pub fn config(&self) -> &SamplerConfig {
        self.decoder.config()
    }

    /// Runs `requests` to the end, `config.max_bsz` at a time (a request waits for a free slot),
    /// calling `on_tokens` with each request's tokens after every step.
    pub fn run(
        &mut self,
        requests: Vec<Request>,
        mut on_tokens: impl FnMut(TokenEvent<'_>),
    ) -> Result<RunOutput> {
        for (index, request) in requests.iter().enumerate() {
            self.check_request(index, request)?;
        }
        let start = Instant::now();
        let mut stats = RunStats::default();
        let n = requests.len();
        let mut waiting: VecDeque<(usize, Request)> = requests.into_iter().enumerate().collect();
        self.in_slot = vec![None; self.decoder.config().max_bsz];
        let mut generated = vec![Vec::new(); n];
        let mut finished = vec![None; n];
        loop {
            let t = Instant::now();
            while self.decoder.free_slots() > 0 {
                let Some((index, request)) = waiting.pop_front() else {
                    break;
                };
                stats.prompt_tokens += request.prompt.len() as u64;
                let slot = self.decoder.insert(request)?;
                self.in_slot[slot] = Some(index);
                self.draft_lengths[slot] =
                    DraftLength::new(self.decoder.config().max_step_tokens.saturating_sub(1));
            }
            stats.specula += t.elapsed();
            if !self.decoder.has_running() {
                break;
            }
            let output = self.step(&mut stats)?;
            let t = Instant::now();
            for slot_output in &output.slots {
                let index = self
                    .in_slot
                    .get(slot_output.slot)
                    .copied()
                    .flatten()
                    .ok_or_else(|| {
                        RunnerError::Internal(format!(
                            "slot {} emitted but holds no request",
                            slot_output.slot
                        ))
                    })?;
                generated[index].extend_from_slice(&slot_output.tokens);
                on_tokens(TokenEvent {
                    request: index,
                    tokens: &slot_output.tokens,
                    finished: slot_output.finished,
                });
                match slot_output.finished {
                    Some(reason) => {
                        self.decoder.remove(slot_output.slot)?;
                        self.in_slot[slot_output.slot] = None;
                        finished[index] = Some(reason);
                    }
                    None if slot_output.tokens.is_empty() => {
                        return Err(RunnerError::Stalled { index });
                    }
                    None => {}
                }
                if let Some(length) = self.draft_lengths.get_mut(slot_output.slot) {
                    length.update(slot_output.drafts_proposed, slot_output.drafts_accepted);
                }
                stats.tokens += slot_output.tokens.len() as u64;
                stats.drafts_proposed += slot_output.drafts_proposed as u64;
                stats.drafts_accepted += slot_output.drafts_accepted as u64;
            }
            stats.specula += t.elapsed();
            stats.steps += 1;
        }
        stats.total = start.elapsed();
        let finished = finished
            .into_iter()
            .enumerate()
            .map(|(index, reason)| reason.ok_or(RunnerError::Stalled { index }))
            .collect::<Result<Vec<_>>>()?;
        Ok(RunOutput {
            generated,
            finished,
            stats,
        })
    }

    /// One decoding step over the running requests.
    fn step(&mut self, stats: &mut RunStats) -> Result<StepOutput> {
        let t = Instant::now();
        self.decoder.propose()?;
        self.runner_drafts()?;
        self.limit_drafts()?;
        let plan = self.decoder.plan()?;
        let planned = t.elapsed();
        let t = Instant::now();
        let logits = self.forward_step(&plan, stats)?;
        let forward = t.elapsed();
        let t = Instant::now();
        let output = {
            let logits = self.device.borrow_host(&logits)?;
            self.decoder.finish(StepScores::logits(&logits))?
        };
        let finished = t.elapsed();
        tracing::debug!(
            step = plan.step,
            requests = plan.slots.len(),
            inputs = plan.token_num(),
            rows = plan.t_out(),
            drafts = plan.drafts(),
            emitted = output.tokens_emitted(),
            forward_ms = forward.as_secs_f64() * 1e3,
            specula_ms = (planned + finished).as_secs_f64() * 1e3,
            "step"
        );
        stats.forward += forward;
        stats.specula += planned + finished;
        Ok(output)
    }

    /// With a [`Drafter`], sets each decoding request's drafts to the drafter's.
    fn runner_drafts(&mut self) -> Result<()> {
        let Some(drafter) = self.drafter.as_mut() else {
            return Ok(());
        };
        let max = self.decoder.config().max_step_tokens.saturating_sub(1);
        for slot in self.decoder.decode_slots() {
            let request = self.in_slot.get(slot).copied().flatten().ok_or_else(|| {
                RunnerError::Internal(format!("slot {slot} decodes but holds no request"))
            })?;
            let generated = self.decoder.generated(slot).unwrap_or_default();
            let mut drafts = drafter.drafts(request, generated, max);
            drafts.truncate(max);
            self.decoder.set_drafts(slot, &drafts)?;
        }
        Ok(())
    }

    /// With the adaptive policy, cuts each decoding request's proposed drafts to its draft length.
    fn limit_drafts(&mut self) -> Result<()> {
        if self.policy != DraftPolicy::Adaptive || self.decoder.config().max_step_tokens < 2 {
            return Ok(());
        }
        for slot in self.decoder.decode_slots() {
            let drafts = self.decoder.drafts(slot)?;
            let allowed = self.draft_lengths[slot].allowed(drafts.len());
            if allowed < drafts.len() {
                let kept = drafts[..allowed].to_vec();
                self.decoder.set_drafts(slot, &kept)?;
            }
        }
        Ok(())
    }

    /// The forward pass of a step, one call per request. Returns the `[T_out, V]` logits in the
    /// plan's row order.
    fn forward_step(&mut self, plan: &StepPlan, stats: &mut RunStats) -> Result<Vec<f32>> {
        let vocab = self.decoder.config().vocab;
        let mut logits = Vec::with_capacity(plan.t_out() * vocab);
        for slot in &plan.slots {
            let before = logits.len();
            let t = Instant::now();
            self.forward
                .forward(&self.decoder, plan, slot, &mut logits)?;
            if slot.kind == SlotStepKind::Prefill {
                stats.prefill += t.elapsed();
                stats.prefills += 1;
            }
            if before != slot.rows.start * vocab || logits.len() != slot.rows.end * vocab {
                return Err(RunnerError::Internal(format!(
                    "slot {}: rows {:?} written as floats {before} .. {}",
                    slot.slot,
                    slot.rows,
                    logits.len()
                )));
            }
        }
        Ok(logits)
    }

    /// Refuses a request the model cannot run, with a message naming it.
    fn check_request(&self, index: usize, request: &Request) -> Result<()> {
        let context = self.decoder.config().max_model_len;
        if request.prompt.is_empty() {
            return Err(RunnerError::EmptyPrompt { index });
        }
        if request.prompt.len() >= context {
            return Err(RunnerError::PromptTooLong {
                index,
                tokens: request.prompt.len(),
                context,
            });
        }
        request.validate(self.decoder.config())?;
        Ok(())
    }
}
