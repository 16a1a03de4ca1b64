//! The sampler's error type.

/// Result alias for the sampler.
pub type Result<T, E = SamplerError> = std::result::Result<T, E>;

/// Everything that can go wrong while driving a [`Decoder`](crate::Decoder).
///
/// Errors of the device itself (a bad argument caught by an op's host-side validation, an
/// execution fault, an unavailable backend) are carried unchanged in [`SamplerError::Device`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SamplerError {
    /// An op or a memory operation of the device failed.
    #[error(transparent)]
    Device(#[from] specula_backend_api::Error),
    /// A [`SamplerConfig`](crate::SamplerConfig) field is out of range.
    #[error("invalid sampler config: {field}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A [`Request`](crate::Request) field is out of range.
    #[error("invalid request: {field}: {reason}")]
    Request {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A slot index is not below `max_bsz`.
    #[error("slot {slot} out of range (max_bsz {max_bsz})")]
    SlotOutOfRange {
        /// The slot asked for.
        slot: usize,
        /// The number of slots.
        max_bsz: usize,
    },
    /// The slot already holds a request.
    #[error("slot {slot} is occupied")]
    SlotOccupied {
        /// The slot.
        slot: usize,
    },
    /// The slot holds no request.
    #[error("slot {slot} is empty")]
    SlotEmpty {
        /// The slot.
        slot: usize,
    },
    /// Every slot holds a request.
    #[error("no free slot (max_bsz {max_bsz})")]
    NoFreeSlot {
        /// The number of slots.
        max_bsz: usize,
    },
    /// A method was called in the wrong phase of a step (e.g. `finish` before `plan`, or `insert`
    /// between `plan` and `finish`). The phase is checked before anything else, so `insert` on a
    /// full decoder during a step reports the phase, not [`NoFreeSlot`](SamplerError::NoFreeSlot).
    #[error("{call} is not allowed now: the step is {phase}")]
    Phase {
        /// The method called.
        call: &'static str,
        /// The phase the decoder is in: `"idle (between steps)"`, `"proposed (after propose,
        /// before plan)"`, `"planned (after plan, before finish)"` or `"pending (after enqueue,
        /// before collect)"`.
        phase: &'static str,
    },
    /// [`Decoder::collect`](crate::Decoder::collect) was handed a
    /// [`PendingStep`](crate::PendingStep) that another decoder enqueued. The decoder called is
    /// left as it was; the step is abandoned, and the decoder that enqueued it collects it itself
    /// at its next `&mut` call (its output then comes from
    /// [`Decoder::take_abandoned`](crate::Decoder::take_abandoned)).
    #[error(
        "collect was handed step {step} of another decoder (this decoder is {phase}): the decoder \
         that enqueued it collects it itself at its next call, its output then in take_abandoned"
    )]
    ForeignStep {
        /// The step number of the step handed over.
        step: u64,
        /// The phase of the decoder called (see [`SamplerError::Phase`]).
        phase: &'static str,
    },
    /// An index argument is not below its bound, e.g. `row_prefix(row)` with `row ≥ T_out`.
    #[error("{argument} {index} out of range: valid values are 0 .. {len} ({bound})")]
    IndexOutOfRange {
        /// The argument (`"row"`, `"input_index"`).
        argument: &'static str,
        /// The value given.
        index: usize,
        /// One past the largest valid value.
        len: usize,
        /// What `len` is (`"T_out"`, `"token_num"`).
        bound: &'static str,
    },
    /// The logits or probabilities given to `finish` do not have the shape of the plan.
    #[error("scores buffer: {reason}")]
    ScoresShape {
        /// What is wrong.
        reason: String,
    },
    /// A buffer handed to the step ([`StepScores`](crate::StepScores)) cannot be used: it belongs
    /// to another device, or its dtype, or its length where the plan fixes it (dense draft rows,
    /// the bitmask), is not what the argument takes. `argument` names it as the runner passed it:
    /// `"StepScores::logits"`, `"StepScores::probs"`, `"StepScores::with_draft"`,
    /// `"StepScores::with_draft_rows"`, `"StepScores::with_draft_probs"`,
    /// `"StepScores::with_draft_probs_rows"` or `"StepScores::with_bitmask"`.
    #[error("{argument}: {reason}")]
    StepBuffer {
        /// The argument, as the runner passed it.
        argument: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Drafts given with `set_drafts` do not fit the slot.
    #[error("drafts for slot {slot}: {reason}")]
    Drafts {
        /// The slot.
        slot: usize,
        /// What is wrong.
        reason: String,
    },
    /// The REJECTION strategy has drafts to verify this step but no draft rows (logits or
    /// probabilities) were given.
    #[error(
        "the rejection strategy needs the draft model's logits or probabilities for the drafts of this step"
    )]
    MissingDraftProbs,
    /// REJECTION was given draft logits with target probabilities (draft logits are weighed at
    /// the target rows' temperatures, which probabilities do not carry).
    #[error("draft logits need target logits: finish was given target probabilities")]
    DraftLogitsNeedLogits,
    /// REJECTION's compact draft rows ([`StepScores::with_draft_rows`](crate::StepScores::with_draft_rows))
    /// are not one row of `V` per draft of the step's plan.
    #[error(
        "compact draft rows: {actual} elements, expected {expected} (one row of V per draft of the plan)"
    )]
    DraftRows {
        /// `drafts · V`.
        expected: usize,
        /// The buffer's length.
        actual: usize,
    },
    /// A request of the step asked for log-probabilities but `finish` was given probabilities
    /// instead of logits.
    #[error("logprobs need logits: finish was given probabilities")]
    LogprobsNeedLogits,
    /// A request or step asks for logits processing (`docs/semantics.md` §4c: a penalty, min_p,
    /// min_tokens, a bias, bad words, allowed tokens or a bitmask) on a device that cannot run it.
    #[error("logits processing is not supported on {device}: {what} needs it")]
    ProcessingUnsupported {
        /// The device.
        device: String,
        /// What asked for it.
        what: &'static str,
    },
    /// A tensor-parallel decoder's exchange with the other ranks failed
    /// ([`Decoder::new_sharded`](crate::Decoder::new_sharded), `docs/runner.md`): a rank
    /// disagrees on something that must be replicated (the vocabulary, the partition, the
    /// configuration, a step's parameters or shapes: [`ShardError::Mismatch`] on every rank), a
    /// rank stopped answering (a timeout), or the communication library failed. Nothing of the
    /// step was committed when it is raised before the commit (the step stays planned), but the
    /// group may be poisoned: the ranks should stop together.
    ///
    /// [`ShardError::Mismatch`]: specula_shard::ShardError::Mismatch
    #[error("tensor parallelism: {0}")]
    Shard(#[from] specula_shard::ShardError),
}

/// The error of [`Decoder::step`](crate::Decoder::step): the sampler's own, or the runner's
/// forward pass's (any type `E`, returned unchanged).
///
/// [`source`](std::error::Error::source) is the inner error. A `StepError<SamplerError>` (a
/// forward pass that returns the sampler's own [`Result`]) converts back into a
/// [`SamplerError`] with `?`.
#[derive(Debug, thiserror::Error)]
pub enum StepError<E> {
    /// Planning or finishing the step failed.
    #[error("sampler: {0}")]
    Sampler(#[source] SamplerError),
    /// The runner's forward pass failed; the step stays planned (call
    /// [`finish`](crate::Decoder::finish) or [`step`](crate::Decoder::step) again).
    #[error("forward pass: {0}")]
    Forward(#[source] E),
}

impl<E> From<SamplerError> for StepError<E> {
    fn from(error: SamplerError) -> Self {
        StepError::Sampler(error)
    }
}

impl From<StepError<SamplerError>> for SamplerError {
    fn from(error: StepError<SamplerError>) -> Self {
        match error {
            StepError::Sampler(e) | StepError::Forward(e) => e,
        }
    }
}
