//! [`Decoder`]: the unified decoding step over a batch of request slots.
//!
//! The [`Decoder`] is the public face: it owns the device buffers, keeps the phase of the step and
//! delegates the work to its stages:
//!
//! - `slots`: the slot table, the host's view of the slots (the requests, their tokens and
//!   lengths, and the host mirrors of the per-slot device values);
//! - `schedule`: the first half of a step, up to the runner's forward pass: the scheduler, the
//!   n-gram proposer or the runner's drafts, and the plan (on the host and on the device);
//! - `finish`: the second half, from the runner's scores: check, targets (from the logits
//!   themselves: no softmax), verification, log-probabilities, then the commit on the device (with
//!   the start of the results' one transfer: `enqueue`) and on the host (`collect`).

mod finish;
mod schedule;
mod sharded;
mod slots;

use std::sync::Arc;

use specula_backend_api::ops::{BatchDims, VocabSlice};
use specula_backend_api::{Buffer, DType, Device, DeviceExt};
use specula_shard::{ExchangeStats, Group};
use tracing::{debug_span, warn};

use crate::buffers::{Scratch, SlotBuffers};
use crate::config::{Request, SamplerConfig};
use crate::error::{Result, SamplerError, StepError};
use crate::processing::Processing;
use crate::step::{DecodeStats, FinishReason, StepOutput, StepPlan, StepScores};
pub use sharded::Sharding;
use slots::{SlotHost, SlotTable};

/// Where the decoder is within a step.
#[derive(Debug)]
enum Phase {
    /// Between steps: requests may be inserted and removed.
    Idle,
    /// The scheduler and the proposer have run; drafts may still be set.
    Proposed { real_bsz: usize },
    /// The layout and per-row parameters are on the device; waiting for the runner's scores.
    Planned { plan: StepPlan },
    /// Enqueued: committed on the device, its results on their way to the host; waiting for
    /// [`Decoder::collect`].
    Pending { plan: StepPlan, in_flight: InFlight },
}

/// The results of an enqueued step on their way to the host, and the ticket its
/// [`PendingStep`] holds: while that is alive, only `collect` with it ends the step; once it is
/// gone (dropped, or refused by another decoder's `collect`), the decoder collects the step itself.
#[derive(Debug)]
struct InFlight {
    downloading: finish::Downloading,
    ticket: Arc<Ticket>,
    /// What a tensor-parallel decoder exchanged with the other ranks for the step.
    exchanged: Option<ExchangeStats>,
}

impl InFlight {
    /// Whether the step's [`PendingStep`] is gone: no one can hand it to `collect` any more.
    fn abandoned(&self) -> bool {
        Arc::strong_count(&self.ticket) == 1
    }
}

/// What ties a [`PendingStep`] to the step it stands for (compared by address).
#[derive(Debug)]
struct Ticket;

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle (between steps)",
            Phase::Proposed { .. } => "proposed (after propose, before plan)",
            Phase::Planned { .. } => "planned (after plan, before finish)",
            Phase::Pending { .. } => "pending (after enqueue, before collect)",
        }
    }
}

/// What the stages of a planned step read: the device, the configuration, the plan, and the
/// rank's group and slice of a tensor-parallel decoder.
struct StepContext<'a> {
    device: &'a dyn Device,
    config: &'a SamplerConfig,
    plan: &'a StepPlan,
    sharding: Option<&'a Sharding>,
}

impl StepContext<'_> {
    /// The batch dimensions of the plan.
    fn dims(&self) -> BatchDims {
        self.config.dims(self.plan.real_bsz)
    }

    /// The length of the score rows the runner passes: `V`, or the rank's slice of it.
    fn width(&self) -> usize {
        self.sharding
            .map_or(self.config.vocab, |s| s.partition().mine().len)
    }
}

/// A step enqueued by [`Decoder::enqueue`]: committed on the device, its results travelling to
/// the host in one transfer. Hand it to [`Decoder::collect`] of the decoder that made it; until
/// then that decoder refuses every call that needs the host state of the slots
/// ([`SamplerError::Phase`] naming the pending phase).
///
/// No misuse wedges a decoder. A `PendingStep` that is dropped uncollected, or handed to another
/// decoder's `collect` (which refuses it with [`SamplerError::ForeignStep`] and drops it),
/// abandons its step: the decoder that made it then collects the step itself at its next `&mut`
/// call (waiting for the transfer as `collect` would, and logging a warning), so the host state
/// stays that of the device, the slots get their tokens ([`Decoder::generated`]), and the step's
/// output waits in [`Decoder::take_abandoned`] (which also collects an abandoned step itself).
#[derive(Debug)]
#[must_use = "a pending step must be collected: its output is otherwise only kept by the decoder"]
pub struct PendingStep {
    step: u64,
    buffers: usize,
    ticket: Arc<Ticket>,
}

impl PendingStep {
    /// The step number.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// How many device buffers travel in the step's one transfer (3 to 9: the accepted tokens,
    /// their counts and the stop flags, plus the row fallbacks of a processed step and five
    /// log-probability buffers when a request asked for them).
    pub fn buffers(&self) -> usize {
        self.buffers
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
/// 4. [`finish`](Decoder::finish): the strategy's target (argmax, sample or candidates),
///    `verify_draft_tokens`, optionally `accept_logprobs`, and `update_state`; returns each
///    slot's emitted tokens. Or, to overlap the transfer of the results with the runner's next
///    forward pass, [`enqueue`](Decoder::enqueue), the runner's work, then
///    [`collect`](Decoder::collect): one blocking wait per step either way.
///
/// Given logits, the step samples from them exactly, without a softmax: each token weighs an
/// integer computed from its logit, the row maximum and the request's temperature
/// (`docs/semantics.md` §4b), the same on every backend. TARGET_MATCH's targets are
/// `top_k_top_p_sample` of the logits rows at each row's temperature, GREEDY's the `argmax` of the
/// logits, TOPP's candidates `top_p_candidates` of the logits, and REJECTION weighs target and
/// draft logits alike (see [`StepScores`] for draft rows). Given probabilities
/// ([`StepScores::probs`]), the same ops read them instead. A logits row of only NaN or −inf
/// weighs 0 everywhere and yields token 0, the devices' documented fallback rather than an error
/// (see [`Scores::Logits`](crate::Scores::Logits)).
///
/// Non-speculative decoding (`S = 1`, or no drafts) runs exactly the same code with zero drafts,
/// and with GREEDY or TARGET_MATCH emits exactly the same tokens as speculative decoding.
#[derive(Debug)]
pub struct Decoder {
    device: Arc<dyn Device>,
    config: SamplerConfig,
    /// The host's view of the slots and the host mirrors of their device values.
    slots: SlotTable,
    state: SlotBuffers,
    scratch: Scratch,
    phase: Phase,
    step: u64,
    stats: DecodeStats,
    /// One rank of a tensor-parallel decoder ([`Decoder::new_sharded`]): its group and slice.
    sharding: Option<Sharding>,
    /// The outputs of the steps the decoder collected itself (see [`PendingStep`]).
    abandoned: Vec<StepOutput>,
}

impl Decoder {
    /// Allocates the device state and scratch buffers for `config` on `device`, after
    /// [`SamplerConfig::validate`]. An n-gram proposer with `max_step_tokens == 1` is not an
    /// error (it never runs) but is logged with `tracing::warn!`.
    pub fn new(device: Arc<dyn Device>, config: SamplerConfig) -> Result<Self> {
        config.validate()?;
        if config.ngram.is_some() && !config.is_speculative() {
            warn!(
                "the n-gram proposer is configured but max_step_tokens is 1: it never runs and \
                 no step has drafts"
            );
        }
        let state = SlotBuffers::new(device.as_ref(), &config)?;
        let scratch = Scratch::new(device.as_ref(), &config)?;
        Ok(Decoder {
            slots: SlotTable::new(config.max_bsz, config.max_step_tokens),
            device,
            config,
            state,
            scratch,
            phase: Phase::Idle,
            step: 0,
            stats: DecodeStats::default(),
            sharding: None,
            abandoned: Vec::new(),
        })
    }

    /// A decoder for one rank of a tensor-parallel runner (`docs/semantics.md` §4d,
    /// `docs/runner.md`): the runner's LM head is split over the ranks of `group`, and this rank
    /// holds the ids `slice` of every logits row. Every rank builds its decoder with the same
    /// `config` and then makes the same calls (the same requests inserted into the same slots,
    /// the same steps), each with its own device; [`finish`](Decoder::finish) takes this rank's
    /// `[R, slice.len]` slice of the logits (and of REJECTION's draft rows), and every rank
    /// emits the tokens the unsharded decoder emits for the whole rows, bit for bit.
    ///
    /// A collective call: the ranks agree on the partition (the slices, in rank order, cover
    /// `0 .. config.vocab` without gap) and on the configuration, and each step's replicated
    /// parameters are checked again (one all-gather of a fingerprint); a disagreement is
    /// [`SamplerError::Shard`] with [`ShardError::Mismatch`] on every rank, a rank that stops
    /// answering a timeout on the others. The device must run the per-rank ops
    /// (`Capabilities::sharded` and `sliced_processing`: every backend).
    ///
    /// [`ShardError::Mismatch`]: specula_shard::ShardError::Mismatch
    pub fn new_sharded(
        device: Arc<dyn Device>,
        config: SamplerConfig,
        group: Group,
        slice: VocabSlice,
    ) -> Result<Self> {
        let sharding = Sharding::agree(device.as_ref(), &config, group, slice)?;
        let mut decoder = Decoder::new(device, config)?;
        decoder.sharding = Some(sharding);
        Ok(decoder)
    }

    /// The rank's group and partition, for a tensor-parallel decoder ([`Decoder::new_sharded`]).
    pub fn sharding(&self) -> Option<&Sharding> {
        self.sharding.as_ref()
    }

    /// Builds every kernel of the device now ([`Device::warm_up`]), so that the first step is
    /// not slowed by compiles: on wgpu the first step otherwise builds its pipelines (seconds on a
    /// software adapter such as lavapipe), xpu-sim its OpenCL programs, CUDA its NVRTC modules;
    /// the CPU backend has nothing to build. Call it once, after [`Decoder::new`] and before the
    /// first step; calling it again builds nothing. It builds the kernels of every op and dtype
    /// the device runs; [`Decoder::warm_up_for`] builds only this configuration's. A kernel that
    /// fails to build is [`SamplerError::Device`] carrying
    /// [`Error::KernelBuild`](specula_backend_api::Error::KernelBuild), which names the op's
    /// kernel.
    pub fn warm_up(&self) -> Result<()> {
        self.device.warm_up().map_err(SamplerError::Device)
    }

    /// Builds the kernels this configuration's steps launch for target rows (logits or
    /// probabilities) of the float dtype `scores`, and nothing else
    /// ([`SamplerConfig::warm_up_plan`], [`Device::warm_up_for`]): a fraction of
    /// [`Decoder::warm_up`]'s work when the runner knows its logits dtype. Steps with target rows
    /// of another dtype still build theirs at first use. Errors as [`Decoder::warm_up`].
    pub fn warm_up_for(&self, scores: DType) -> Result<()> {
        self.device
            .warm_up_for(&self.config.warm_up_plan(scores))
            .map_err(SamplerError::Device)
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
    /// prefill of the whole prompt. Only between steps: during a step (after
    /// [`propose`](Decoder::propose) or [`plan`](Decoder::plan), before
    /// [`finish`](Decoder::finish)) it is [`SamplerError::Phase`], whether or not a slot is free.
    pub fn insert(&mut self, request: Request) -> Result<usize> {
        self.collect_abandoned()?;
        self.require_idle("insert")?;
        let slot = self.slots.first_free().ok_or(SamplerError::NoFreeSlot {
            max_bsz: self.config.max_bsz,
        })?;
        self.insert_at(slot, request)?;
        Ok(slot)
    }

    /// Inserts a request into a given free slot. Only between steps.
    pub fn insert_at(&mut self, slot: usize, request: Request) -> Result<()> {
        self.collect_abandoned()?;
        self.require_idle("insert")?;
        self.check_slot(slot)?;
        if self.slots.is_occupied(slot) {
            return Err(SamplerError::SlotOccupied { slot });
        }
        request.validate(&self.config)?;
        // Processing first: `load_request` loads the slot's processing rows too, and makes the
        // slot live on the device, last.
        if request.processes_logits() {
            self.enable_processing("a request's sampling parameters")?;
        }
        self.state
            .load_request(self.device.as_ref(), &self.config, slot, &request)?;
        if let Some(sharding) = self.sharding.as_mut() {
            sharding.set_request(slot, Some(&request));
        }
        self.slots.insert(slot, request);
        Ok(())
    }

    /// Allocates the logits-processing state (`docs/semantics.md` §4c) on first use, loading the
    /// requests already in their slots (their counts from the tokens they generated).
    /// [`SamplerError::ProcessingUnsupported`] (nothing changed) when the device cannot process
    /// logits; `what` says what asked for it.
    fn enable_processing(&mut self, what: &'static str) -> Result<()> {
        if self.state.processing.is_some() {
            return Ok(());
        }
        let device = self.device.as_ref();
        if !device.capabilities().processing {
            return Err(SamplerError::ProcessingUnsupported {
                device: device.info().name.clone(),
                what,
            });
        }
        let mut processing = Processing::new(device, &self.config)?;
        for slot in self.slots.occupied() {
            if let Some(host) = self.slots.get(slot) {
                processing.load(device, slot, &host.request, host.generated())?;
            }
        }
        self.state.processing = Some(processing);
        Ok(())
    }

    /// Takes the request out of its slot (finished or not) and frees the slot. Only between steps.
    pub fn remove(&mut self, slot: usize) -> Result<RemovedRequest> {
        self.collect_abandoned()?;
        self.require_idle("remove")?;
        self.check_slot(slot)?;
        if !self.slots.is_occupied(slot) {
            return Err(SamplerError::SlotEmpty { slot });
        }
        self.state.clear_slot(self.device.as_ref(), slot)?;
        if let Some(p) = self.state.processing.as_mut() {
            p.clear(slot);
        }
        if let Some(sharding) = self.sharding.as_mut() {
            sharding.set_request(slot, None);
        }
        let host = self
            .slots
            .remove(slot)
            .ok_or(SamplerError::SlotEmpty { slot })?;
        Ok(RemovedRequest {
            generated: host.generated().to_vec(),
            finished: host.finished,
            request: host.request,
        })
    }

    /// The tokens a slot's request has generated so far (`None` for an empty slot).
    pub fn generated(&self, slot: usize) -> Option<&[i32]> {
        self.slots.get(slot).map(SlotHost::generated)
    }

    /// Prompt followed by the generated tokens (`None` for an empty slot).
    pub fn context(&self, slot: usize) -> Option<&[i32]> {
        self.slots.get(slot).map(|h| h.tokens.as_slice())
    }

    /// The request in a slot.
    pub fn request(&self, slot: usize) -> Option<&Request> {
        self.slots.get(slot).map(|h| &h.request)
    }

    /// Why the slot's request stopped; `None` while it runs (or for an empty slot).
    pub fn finish_reason(&self, slot: usize) -> Option<FinishReason> {
        self.slots.get(slot)?.finished
    }

    /// Whether the slot holds a request that has not stopped.
    pub fn is_running(&self, slot: usize) -> bool {
        self.slots.is_running(slot)
    }

    /// Whether any slot holds a request that has not stopped.
    pub fn has_running(&self) -> bool {
        self.slots.has_running()
    }

    /// The occupied slots, in order.
    pub fn occupied_slots(&self) -> Vec<usize> {
        self.slots.occupied()
    }

    /// The slots that decode in the current step (or, between steps, in the next one): every
    /// running request past its prefill, in slot order. A newly inserted request's first step is
    /// a prefill and is not listed; stopped requests are not listed.
    ///
    /// Between [`propose`](Decoder::propose) and [`plan`](Decoder::plan) these are exactly the
    /// slots [`set_drafts`](Decoder::set_drafts) accepts: a runner with its own draft model
    /// drafts for them.
    ///
    /// ```
    /// use specula_backend_api::Strategy;
    /// use specula_sampler::{Decoder, Request, SamplerConfig, registry};
    ///
    /// let config = SamplerConfig::plain(Strategy::Greedy, 2, 8, 32, vec![0]).with_runner_drafts(3);
    /// let mut decoder = Decoder::new(registry::open("cpu")?, config)?;
    /// decoder.insert(Request::new(vec![1, 2]))?;
    /// decoder.propose()?;
    /// assert!(decoder.decode_slots().is_empty()); // slot 0 is a prefill this step
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode_slots(&self) -> Vec<usize> {
        self.slots.decoding()
    }

    /// Number of free slots.
    pub fn free_slots(&self) -> usize {
        self.slots.free_count()
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
        self.collect_abandoned()?;
        match self.phase {
            Phase::Idle => {}
            Phase::Proposed { .. } => return Ok(()),
            Phase::Planned { .. } | Phase::Pending { .. } => {
                return Err(SamplerError::Phase {
                    call: "propose",
                    phase: self.phase.name(),
                });
            }
        }
        let device = self.device.as_ref();
        let real_bsz = schedule::propose(device, &self.config, &mut self.slots, &mut self.state)?;
        self.phase = Phase::Proposed { real_bsz };
        Ok(())
    }

    /// Sets the drafts of a running decode slot for this step (a runner's own draft model). Call
    /// after [`propose`](Decoder::propose) and before [`plan`](Decoder::plan); at most `S − 1`
    /// tokens, each in `0 .. V`. Replaces any drafts the n-gram proposer made.
    pub fn set_drafts(&mut self, slot: usize, drafts: &[i32]) -> Result<()> {
        self.collect_abandoned()?;
        if !matches!(self.phase, Phase::Proposed { .. }) {
            return Err(SamplerError::Phase {
                call: "set_drafts",
                phase: self.phase.name(),
            });
        }
        self.check_slot(slot)?;
        let device = self.device.as_ref();
        let (slots, state) = (&mut self.slots, &mut self.state);
        schedule::set_drafts(device, &self.config, slots, state, slot, drafts)
    }

    /// The drafts `slot` feeds this step: after [`propose`](Decoder::propose) (and any
    /// [`set_drafts`](Decoder::set_drafts)) and before [`plan`](Decoder::plan), what the n-gram
    /// proposer (or the runner) put in its draft row. Empty for a slot that does not decode this
    /// step. A runner that limits the drafts of a request (an adaptive draft length) passes a
    /// prefix of them back to `set_drafts`.
    ///
    /// ```
    /// use specula_backend_api::Strategy;
    /// use specula_sampler::{Decoder, Request, SamplerConfig, registry};
    ///
    /// let config = SamplerConfig::plain(Strategy::Greedy, 1, 8, 32, vec![0]).with_runner_drafts(4);
    /// let mut decoder = Decoder::new(registry::open("cpu")?, config)?;
    /// decoder.insert(Request::new(vec![1, 2]))?;
    /// decoder.propose()?;
    /// assert!(decoder.drafts(0)?.is_empty()); // a prefill
    /// decoder.plan()?;
    /// assert!(decoder.drafts(0).is_err()); // only between propose and plan
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drafts(&self, slot: usize) -> Result<&[i32]> {
        if !matches!(self.phase, Phase::Proposed { .. }) {
            return Err(SamplerError::Phase {
                call: "drafts",
                phase: self.phase.name(),
            });
        }
        self.check_slot(slot)?;
        let (this_time, encoder) = self.slots.lens(slot);
        if this_time <= 0 || encoder > 0 {
            return Ok(&[]);
        }
        Ok(self.slots.drafts(slot, this_time as usize - 1))
    }

    /// Builds the output layout and the per-row sampling parameters on the device and returns
    /// what the runner must compute. Runs [`propose`](Decoder::propose) first if needed; calling it
    /// again before [`finish`](Decoder::finish) returns the same plan. An empty plan means there is
    /// no running request: nothing to compute, and no `finish` to call.
    pub fn plan(&mut self) -> Result<StepPlan> {
        self.collect_abandoned()?;
        match &self.phase {
            Phase::Planned { plan } => return Ok(plan.clone()),
            Phase::Pending { .. } => {
                return Err(SamplerError::Phase {
                    call: "plan",
                    phase: self.phase.name(),
                });
            }
            Phase::Idle | Phase::Proposed { .. } => {}
        }
        self.propose()?;
        let Phase::Proposed { real_bsz } = self.phase else {
            return Err(SamplerError::Phase {
                call: "plan",
                phase: self.phase.name(),
            });
        };
        let s = self.config.max_step_tokens;
        let plan = schedule::host_plan(&self.slots, self.step, real_bsz, s);
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
        let cx = StepContext {
            device: self.device.as_ref(),
            config: &self.config,
            plan: &plan,
            sharding: self.sharding.as_ref(),
        };
        schedule::build_step(&cx, &self.slots, &self.state, &mut self.scratch)?;
        self.phase = Phase::Planned { plan: plan.clone() };
        Ok(plan)
    }

    /// Gathers the hidden state each output row predicts from (`docs/semantics.md` §5.2):
    /// `hidden_states` is `[token_num, hidden]` in the packed order of the plan (any dtype), `out`
    /// is `[gather_rows, hidden]` of the same dtype; rows `≥ T_out` are zeros. Bit-exact copy.
    pub fn gather_next_token(
        &self,
        hidden_states: &Buffer,
        hidden: usize,
        out: &mut Buffer,
    ) -> Result<()> {
        let plan = self.current_plan("gather_next_token")?;
        let cx = StepContext {
            device: self.device.as_ref(),
            config: &self.config,
            plan,
            sharding: self.sharding.as_ref(),
        };
        let (slots, state, scratch) = (&self.slots, &self.state, &self.scratch);
        schedule::gather(&cx, slots, state, scratch, hidden_states, hidden, out)
    }

    /// The tokens up to and including packed input token `input_index` of the current plan: the
    /// sequence whose next token that position predicts. For runners without a KV cache (and toy
    /// models whose probabilities are a function of the prefix). An `input_index ≥ token_num` is
    /// [`SamplerError::IndexOutOfRange`] naming `input_index`.
    pub fn input_prefix(&self, input_index: usize) -> Result<Vec<i32>> {
        let plan = self.current_plan("input_prefix")?;
        schedule::input_prefix(plan, &self.slots, input_index)
    }

    /// The tokens output row `row` of the current plan predicts from (see
    /// [`input_prefix`](Decoder::input_prefix)). A `row ≥ T_out` is
    /// [`SamplerError::IndexOutOfRange`] naming `row`.
    pub fn row_prefix(&self, row: usize) -> Result<Vec<i32>> {
        let plan = self.current_plan("row_prefix")?;
        let output = plan
            .output_rows
            .get(row)
            .ok_or(SamplerError::IndexOutOfRange {
                argument: "row",
                index: row,
                len: plan.t_out(),
                bound: "T_out",
            })?;
        self.input_prefix(output.input_index)
    }

    /// Finishes the step with the runner's scores: the strategy's target (sampled from logits
    /// exactly, without a softmax), verification, optional log-probabilities and the state
    /// update. Returns what each slot emitted.
    ///
    /// `scores.target` has `T_out ≤ R ≤ gather_rows` rows; REJECTION with drafts needs the draft
    /// model's rows (of the target's kind with [`StepScores::with_draft`], or probabilities with
    /// [`StepScores::with_draft_probs`]) and verifies against all `R` target rows.
    ///
    /// An error caught before the device state is updated (a wrong shape, a missing input, an op's
    /// validation) leaves the step planned, so `finish` can be called again with the right
    /// arguments. An error after that (a failed download) ends the step; the decoder's host mirrors
    /// may then disagree with the device and it should be discarded.
    ///
    /// `finish` is [`enqueue`](Decoder::enqueue) then [`collect`](Decoder::collect), with the same
    /// results; a runner that overlaps the step with its next forward pass calls the two itself.
    pub fn finish(&mut self, scores: StepScores<'_>) -> Result<StepOutput> {
        let pending = self.enqueue_as("finish", scores)?;
        self.collect(pending)
    }

    /// The device half of [`finish`](Decoder::finish): the strategy's target, verification,
    /// optional log-probabilities and `update_state` are enqueued on the device, and the step's
    /// results start their one transfer to the host, without waiting for them. Returns the
    /// [`PendingStep`] to hand to [`collect`](Decoder::collect); in between the host is free, so
    /// the runner can run its next forward pass (on its own buffers) while the tokens travel.
    ///
    /// Errors as for `finish`: one caught before the device state is updated leaves the step
    /// planned (call `enqueue` again); one after it (starting the transfer) ends the step. While a
    /// step is pending, [`insert`](Decoder::insert), [`remove`](Decoder::remove),
    /// [`propose`](Decoder::propose), [`plan`](Decoder::plan) and `enqueue` are
    /// [`SamplerError::Phase`] naming the pending phase; the host view of the slots
    /// ([`generated`](Decoder::generated), ...) is that of before the step.
    pub fn enqueue(&mut self, scores: StepScores<'_>) -> Result<PendingStep> {
        self.enqueue_as("enqueue", scores)
    }

    /// [`enqueue`](Decoder::enqueue), its phase errors naming `call`.
    fn enqueue_as(&mut self, call: &'static str, scores: StepScores<'_>) -> Result<PendingStep> {
        self.collect_abandoned()?;
        self.current_plan(call)?;
        if scores.bitmask.is_some() {
            self.enable_processing("a token bitmask")?;
        }
        if let Some(p) = self.state.processing.as_mut() {
            p.sync(self.device.as_ref())?;
        }
        let plan = self.take_plan(call)?;
        let _span = debug_span!(
            "decode_step",
            step = self.step,
            real_bsz = plan.real_bsz,
            t_out = plan.t_out()
        )
        .entered();
        let cx = StepContext {
            device: self.device.as_ref(),
            config: &self.config,
            plan: &plan,
            sharding: self.sharding.as_ref(),
        };
        let exchanged_before = self.sharding.as_ref().map(Sharding::exchanged);
        let verified =
            match finish::verify_step(&cx, &self.slots, &self.state, &mut self.scratch, scores) {
                Ok(verified) => verified,
                Err(error) => {
                    // Nothing is committed: the step stays planned and can be finished again.
                    self.phase = Phase::Planned { plan };
                    return Err(error);
                }
            };
        let exchanged = self
            .sharding
            .as_ref()
            .zip(exchanged_before)
            .map(|(s, before)| s.exchanged().since(&before));
        // The point of no return: from here an error ends the step.
        let downloading =
            finish::commit_on_device(&cx, &mut self.state, &mut self.scratch, verified)?;
        let ticket = Arc::new(Ticket);
        let pending = PendingStep {
            step: self.step,
            buffers: downloading.buffers(),
            ticket: ticket.clone(),
        };
        let in_flight = InFlight {
            downloading,
            ticket,
            exchanged,
        };
        self.phase = Phase::Pending { plan, in_flight };
        Ok(pending)
    }

    /// The host half of [`finish`](Decoder::finish): waits once for the pending step's results
    /// (one blocking wait of the device, however many buffers), takes each slot's emitted tokens,
    /// log-probabilities and finish reason into the slots and returns them; the decoder is then
    /// between steps. A failed transfer ends the step (see `finish`).
    ///
    /// A `pending` step this decoder did not enqueue is [`SamplerError::ForeignStep`]: this
    /// decoder is left as it was, and the step is abandoned — the decoder that enqueued it
    /// collects it itself at its next `&mut` call, its output then waiting in
    /// [`take_abandoned`](Decoder::take_abandoned) (see [`PendingStep`]).
    pub fn collect(&mut self, pending: PendingStep) -> Result<StepOutput> {
        let ours = matches!(
            &self.phase,
            Phase::Pending { in_flight, .. } if Arc::ptr_eq(&in_flight.ticket, &pending.ticket)
        );
        let step = pending.step;
        drop(pending);
        if !ours {
            self.collect_abandoned()?;
            return Err(SamplerError::ForeignStep {
                step,
                phase: self.phase.name(),
            });
        }
        self.collect_pending("collect")
    }

    /// The outputs of the steps this decoder collected itself because their [`PendingStep`] was
    /// dropped or handed to another decoder, oldest first — a step abandoned since the last call
    /// is collected now; taking them empties the list. (Their tokens are in the slots,
    /// [`generated`](Decoder::generated), either way.) An error is that of the transfer of a step
    /// collected now (see [`collect`](Decoder::collect)).
    pub fn take_abandoned(&mut self) -> Result<Vec<StepOutput>> {
        self.collect_abandoned()?;
        Ok(std::mem::take(&mut self.abandoned))
    }

    /// Collects the pending step if its [`PendingStep`] is gone, keeping its output for
    /// [`take_abandoned`](Decoder::take_abandoned); nothing otherwise. Every `&mut` call that
    /// depends on the phase runs it first, so an abandoned step never wedges the decoder.
    fn collect_abandoned(&mut self) -> Result<()> {
        if !matches!(&self.phase, Phase::Pending { in_flight, .. } if in_flight.abandoned()) {
            return Ok(());
        }
        warn!(
            step = self.step,
            "a PendingStep was dropped or handed to another decoder: the decoder collects the \
             step itself (its output waits in take_abandoned)"
        );
        let output = self.collect_pending("collect (of an abandoned step)")?;
        self.abandoned.push(output);
        Ok(())
    }

    /// Waits for the pending step's results and commits them on the host; `call` names the
    /// caller in a phase error.
    fn collect_pending(&mut self, call: &'static str) -> Result<StepOutput> {
        let (plan, in_flight) = match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Pending { plan, in_flight } => (plan, in_flight),
            other => {
                let error = SamplerError::Phase {
                    call,
                    phase: other.name(),
                };
                self.phase = other;
                return Err(error);
            }
        };
        let cx = StepContext {
            device: self.device.as_ref(),
            config: &self.config,
            plan: &plan,
            sharding: self.sharding.as_ref(),
        };
        let committed = in_flight.downloading.wait()?;
        let mut host = finish::commit_on_host(&cx, &mut self.slots, &mut self.stats, committed);
        if let Some(exchanged) = in_flight.exchanged {
            host.output.exchanged = Some(exchanged);
            self.stats.exchange_calls += exchanged.calls;
            self.stats.exchange_bytes += exchanged.bytes;
        }
        self.step += 1;
        finish::stop_on_device(self.device.as_ref(), &mut self.state, &host)?;
        Ok(host.output)
    }

    /// A whole step: [`plan`](Decoder::plan), then `forward` (the runner's model, which returns
    /// `[R, V]` logits for the plan, or its own error `E`), then [`finish`](Decoder::finish).
    /// Returns `None` when there was nothing to run.
    ///
    /// A failed forward pass is [`StepError::Forward`] with the runner's error, unchanged; the
    /// step stays planned, so the next `step` (or `finish`) finishes it. The sampler's own
    /// errors are [`StepError::Sampler`]. A forward pass that returns the sampler's
    /// [`Result`](crate::Result) gives `StepError<SamplerError>`, which `?` turns back into a
    /// [`SamplerError`].
    ///
    /// ```
    /// use specula_backend_api::{DeviceExt, Strategy};
    /// use specula_sampler::{Decoder, Request, SamplerConfig, StepError, registry};
    ///
    /// /// The runner's own error type.
    /// #[derive(Debug, thiserror::Error)]
    /// #[error("the model ran out of memory")]
    /// struct ModelError;
    ///
    /// let device = registry::open("cpu")?;
    /// let config = SamplerConfig::plain(Strategy::Greedy, 1, 8, 32, vec![0]);
    /// let mut decoder = Decoder::new(device.clone(), config)?;
    /// decoder.insert(Request::new(vec![1]).with_max_dec_len(2))?;
    /// let failed = decoder.step(|_, _| Err(ModelError));
    /// assert!(matches!(failed, Err(StepError::Forward(ModelError))));
    /// while decoder.has_running() {
    ///     decoder.step(|_, plan| device.upload(&vec![1.0f32; plan.t_out() * 8]))?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn step<F, E>(
        &mut self,
        forward: F,
    ) -> std::result::Result<Option<StepOutput>, StepError<E>>
    where
        F: FnOnce(&Decoder, &StepPlan) -> std::result::Result<Buffer, E>,
    {
        let plan = self.plan()?;
        if plan.is_empty() {
            return Ok(None);
        }
        let logits = forward(self, &plan).map_err(StepError::Forward)?;
        Ok(Some(self.finish(StepScores::logits(&logits))?))
    }

    // ----- internals -----

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

    /// Takes the plan out of a planned step, leaving the decoder idle.
    fn take_plan(&mut self, call: &'static str) -> Result<StepPlan> {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Planned { plan } => Ok(plan),
            other => {
                let error = SamplerError::Phase {
                    call,
                    phase: other.name(),
                };
                self.phase = other;
                Err(error)
            }
        }
    }
}
