//! The host-side view of one step: what the runner must compute ([`StepPlan`]), what it hands
//! back ([`StepScores`]) and what the step produced ([`StepOutput`]).

use std::ops::Range;

use specula_backend_api::Buffer;

/// What a non-empty slot does this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotStepKind {
    /// The whole prompt is fed; one output row predicts the first generated token.
    Prefill,
    /// The last accepted token plus the drafts are fed; one output row per fed token.
    Decode,
}

/// One non-empty slot of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotPlan {
    /// The slot.
    pub slot: usize,
    /// Prefill or decode.
    pub kind: SlotStepKind,
    /// Its packed input tokens: a range of [`StepPlan::input_tokens`].
    pub inputs: Range<usize>,
    /// Sequence position of its first input token (the tokens before it are in the KV cache).
    pub start_position: usize,
    /// Number of draft tokens among its inputs (0 for a prefill).
    pub drafts: usize,
    /// Its output rows: a range of [`StepPlan::output_rows`].
    pub rows: Range<usize>,
}

/// One output row: the prediction of the token after one packed input token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputRow {
    /// The slot.
    pub slot: usize,
    /// The packed input token it predicts from (an index into [`StepPlan::input_tokens`]).
    pub input_index: usize,
    /// That token's sequence position.
    pub position: usize,
}

/// What the runner's forward pass must compute this step.
///
/// Input tokens are packed without gaps in slot order (`docs/semantics.md` §2); the runner feeds
/// them, gathers the hidden state of each output row (with
/// [`Decoder::gather_next_token`](crate::Decoder::gather_next_token) or its own gather), applies
/// its LM head and hands `[R, V]` logits or probabilities to
/// [`Decoder::finish`](crate::Decoder::finish), where `T_out ≤ R ≤ gather_rows` and row `t < T_out`
/// belongs to `output_rows[t]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// The step number (0-based, counting finished steps).
    pub step: u64,
    /// Slots `0 .. real_bsz` are described to the ops this step.
    pub real_bsz: usize,
    /// Packed input tokens.
    pub input_tokens: Vec<i32>,
    /// Sequence position of each packed input token.
    pub input_positions: Vec<usize>,
    /// The non-empty slots, in slot order.
    pub slots: Vec<SlotPlan>,
    /// The output rows, `T_out` of them.
    pub output_rows: Vec<OutputRow>,
    /// Rows of the output of `gather_next_token` (`real_bsz · S`); rows `≥ T_out` are padding.
    pub gather_rows: usize,
}

impl StepPlan {
    /// `T_out`: the number of output rows.
    pub fn t_out(&self) -> usize {
        self.output_rows.len()
    }

    /// Packed input tokens.
    pub fn token_num(&self) -> usize {
        self.input_tokens.len()
    }

    /// Whether there is nothing to compute (no running request).
    pub fn is_empty(&self) -> bool {
        self.output_rows.is_empty()
    }

    /// Draft tokens proposed this step, over all slots.
    pub fn drafts(&self) -> usize {
        self.slots.iter().map(|s| s.drafts).sum()
    }
}

/// What the runner's LM head produced: `[R, V]` rows, `T_out ≤ R ≤ gather_rows`.
#[derive(Clone, Copy, Debug)]
pub enum Scores<'a> {
    /// Logits (f32, f16 or bf16): the decoder samples from them exactly, with the integer weights
    /// of `docs/semantics.md` §4b at each request's temperature; no softmax runs.
    ///
    /// A row with no usable logit (every value NaN or −inf) is not an error: it weighs 0
    /// everywhere, and the step emits the first token in rank order, token 0, under every
    /// strategy (the devices' fallback, `docs/semantics.md` §4b). The exception is REJECTION given
    /// draft *probabilities*: the target's `softmax` makes such a row uniform, so that step samples
    /// it uniformly. Nothing is logged: finding such rows would mean downloading the logits.
    Logits(&'a Buffer),
    /// Probabilities (f32, f16 or bf16) the runner computed itself: temperature is not applied
    /// again and log-probabilities cannot be computed.
    Probs(&'a Buffer),
}

impl<'a> Scores<'a> {
    /// The `[R, V]` buffer.
    pub fn buffer(&self) -> &'a Buffer {
        match self {
            Scores::Logits(b) | Scores::Probs(b) => b,
        }
    }

    /// Whether the rows are logits.
    pub fn is_logits(&self) -> bool {
        matches!(self, Scores::Logits(_))
    }

    /// `buffer` as rows of the same kind as these.
    fn same_kind(&self, buffer: &'a Buffer) -> Self {
        match self {
            Scores::Logits(_) => Scores::Logits(buffer),
            Scores::Probs(_) => Scores::Probs(buffer),
        }
    }
}

/// The arguments of [`Decoder::finish`](crate::Decoder::finish).
///
/// REJECTION reads the draft model's rows `[max_bsz · (S − 1), V]`, row `b · (S − 1) + i` for
/// draft `i + 1` of slot `b`, required when a step has drafts:
/// - [`with_draft`](StepScores::with_draft): of the same kind as the target. Draft logits are
///   weighed at the temperature of the output row they are checked against, so target and draft
///   logits are verified exactly, without a softmax (`docs/semantics.md` §4b).
/// - [`with_draft_probs`](StepScores::with_draft_probs): draft probabilities. With target logits,
///   the target's probabilities are then computed by `softmax` at each row's temperature (a float
///   op) for the steps that verify drafts.
///
/// REJECTION verifies against all `R` target rows the runner gives: rows `≥ T_out` are never
/// read, and the slot lengths are checked on the host only when `R == T_out`
/// (`verify_draft_tokens` takes padded per-row inputs only without host lengths).
#[derive(Clone, Copy, Debug)]
pub struct StepScores<'a> {
    /// The target model's rows.
    pub target: Scores<'a>,
    /// REJECTION only: the draft model's rows (draft logits need target logits).
    pub draft: Option<Scores<'a>>,
    /// The draft rows are compact (`docs/semantics.md` §5.8.1): one row of `V` per draft of the
    /// plan, in the plan's order (slot order, then draft order), rather than the dense
    /// `[max_bsz · (S − 1), V]`.
    pub compact_draft: bool,
    /// A token bitmask for structured output: `[R, ceil(V / 32)]` u32, one row per score row;
    /// a 0 bit masks the token (`docs/semantics.md` §4c).
    pub bitmask: Option<&'a Buffer>,
}

impl<'a> StepScores<'a> {
    /// Logits of the target model. Rows of only NaN or −inf give token 0 rather than an error
    /// (see [`Scores::Logits`]).
    pub fn logits<B: AsRef<Buffer> + ?Sized>(logits: &'a B) -> Self {
        StepScores {
            target: Scores::Logits(logits.as_ref()),
            draft: None,
            compact_draft: false,
            bitmask: None,
        }
    }

    /// Probabilities of the target model.
    pub fn probs<B: AsRef<Buffer> + ?Sized>(probs: &'a B) -> Self {
        StepScores {
            target: Scores::Probs(probs.as_ref()),
            draft: None,
            compact_draft: false,
            bitmask: None,
        }
    }

    /// Adds the draft model's rows (REJECTION), of the same kind as the target: logits with
    /// target logits, probabilities with target probabilities.
    pub fn with_draft<B: AsRef<Buffer> + ?Sized>(mut self, draft: &'a B) -> Self {
        self.draft = Some(self.target.same_kind(draft.as_ref()));
        self.compact_draft = false;
        self
    }

    /// Adds only the drafted rows of the draft model (REJECTION), of the same kind as the
    /// target: `[n_drafts, V]`, one row per draft of the plan in the plan's order (slot order,
    /// then draft order; [`StepPlan::drafts`] rows in all). The decoder gives the op the index
    /// of each draft's row (`docs/semantics.md` §5.8.1).
    pub fn with_draft_rows<B: AsRef<Buffer> + ?Sized>(mut self, draft_rows: &'a B) -> Self {
        self.draft = Some(self.target.same_kind(draft_rows.as_ref()));
        self.compact_draft = true;
        self
    }

    /// Adds a token bitmask (structured output): `[R, ceil(V / 32)]` u32, bit `v mod 32` of word
    /// `v / 32` of row `r` allows token `v` in score row `r`.
    pub fn with_bitmask<B: AsRef<Buffer> + ?Sized>(mut self, bitmask: &'a B) -> Self {
        self.bitmask = Some(bitmask.as_ref());
        self
    }

    /// Adds the draft model's probabilities (REJECTION), whatever the target's kind.
    pub fn with_draft_probs<B: AsRef<Buffer> + ?Sized>(mut self, draft_probs: &'a B) -> Self {
        self.draft = Some(Scores::Probs(draft_probs.as_ref()));
        self.compact_draft = false;
        self
    }

    /// Adds only the drafted rows of the draft model as probabilities (REJECTION), whatever the
    /// target's kind: `[n_drafts, V]` in the order of
    /// [`with_draft_rows`](StepScores::with_draft_rows).
    pub fn with_draft_probs_rows<B: AsRef<Buffer> + ?Sized>(mut self, draft_probs: &'a B) -> Self {
        self.draft = Some(Scores::Probs(draft_probs.as_ref()));
        self.compact_draft = true;
        self
    }
}

/// Why a request stopped.
///
/// When one token ends a request for several reasons, `Masked` wins, then (with
/// [`SamplerConfig::fastdeploy_max_dec_len`](crate::SamplerConfig::fastdeploy_max_dec_len))
/// `Length`, then `EndToken`, then `Length`, then `MaxModelLen`: a last token that is an end
/// token and also the `max_dec_len`-th is `EndToken`, as in vLLM, unless FastDeploy's op
/// replaced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// It emitted one of the decoder's end tokens or one of its own
    /// [`stop_tokens`](crate::Request::stop_tokens) (kept as its last token).
    EndToken,
    /// It generated `max_dec_len` tokens (vLLM's "length"). Its last token is the model's own,
    /// except with [`SamplerConfig::fastdeploy_max_dec_len`](crate::SamplerConfig::fastdeploy_max_dec_len),
    /// where the op replaced it by `end_tokens[0]`. (This variant was called `MaxDecLen` when the
    /// replacement was the only behaviour.)
    Length,
    /// Prompt plus generated tokens filled `max_model_len`.
    MaxModelLen,
    /// Logits processing masked every token of its row (`docs/semantics.md` §4c): its last token
    /// is `end_tokens[0]`, emitted in place of a token.
    Masked,
}

/// The log-probability of one emitted token (`docs/semantics.md` §5.11).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: i32,
    /// Its log-probability under `log_softmax(logits / temperature)`.
    pub logprob: f32,
    /// 1 + the number of tokens with a strictly larger logit.
    pub rank: i32,
    /// The request's top-`k` alternatives, most probable first: `(token, logprob)`.
    pub top: Vec<(i32, f32)>,
}

/// What one slot emitted in a step.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotOutput {
    /// The slot.
    pub slot: usize,
    /// The emitted tokens, in order (accepted drafts, then the correction or bonus token).
    pub tokens: Vec<i32>,
    /// Drafts proposed for it this step.
    pub drafts_proposed: usize,
    /// Drafts accepted.
    pub drafts_accepted: usize,
    /// Set when the request stopped this step.
    pub finished: Option<FinishReason>,
    /// Log-probabilities of `tokens`, when the request asked for them
    /// ([`Request::with_logprobs`](crate::Request::with_logprobs)), with its `k` alternatives
    /// each.
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// What a step produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutput {
    /// The step number.
    pub step: u64,
    /// One entry per slot that ran this step, in slot order.
    pub slots: Vec<SlotOutput>,
    /// What a tensor-parallel decoder ([`Decoder::new_sharded`](crate::Decoder::new_sharded))
    /// exchanged with the other ranks for the step: collective calls and bytes (the same on
    /// every rank). `None` for a decoder of one device.
    pub exchanged: Option<specula_shard::ExchangeStats>,
}

impl StepOutput {
    /// Tokens emitted over all slots.
    pub fn tokens_emitted(&self) -> usize {
        self.slots.iter().map(|s| s.tokens.len()).sum()
    }
}

/// Totals over a decoder's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Steps finished (empty steps are not counted).
    pub steps: u64,
    /// Tokens emitted.
    pub tokens_emitted: u64,
    /// Drafts proposed.
    pub drafts_proposed: u64,
    /// Drafts accepted.
    pub drafts_accepted: u64,
    /// Collective calls a tensor-parallel decoder made (0 for a decoder of one device).
    pub exchange_calls: u64,
    /// Bytes a tensor-parallel decoder exchanged with the other ranks.
    pub exchange_bytes: u64,
}

impl DecodeStats {
    /// Accepted drafts over proposed drafts (0 when none were proposed).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafts_proposed == 0 {
            0.0
        } else {
            self.drafts_accepted as f64 / self.drafts_proposed as f64
        }
    }
}
